//! Spec texts in the snapshot history: stored once whatever the number of
//! versions holding them, read back whole, deleted with the last version that
//! refers to them; on SQLite and PostgreSQL.

use super::*;
use crate::model::Spec;

on_both_stores!(a_spec_is_stored_once_across_versions_and_pruned_with_them);

fn fruitshop(title: &str) -> Spec {
    let text = sluice_testkit::example("fruitshop/fruitshop-v2-2-0.oas.yml").unwrap();
    let content = text.replacen("title: \"Fruit Shop API\"", &format!("title: \"{title}\""), 1);
    assert!(content.contains(title), "the title line moved");
    Spec { name: "fruitshop".into(), content, openapi_version: None, title: None }
}

async fn count(store: &Store, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&store.inner.pool).await.unwrap()
}

/// Every stored text, and the longest `config` and `snapshot` of the history.
async fn stored(store: &Store) -> (BTreeSet<String>, usize) {
    let texts = sqlx::query_scalar::<_, String>("SELECT content FROM spec_contents")
        .fetch_all(&store.inner.pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let rows = sqlx::query("SELECT config, snapshot FROM snapshots").fetch_all(&store.inner.pool).await.unwrap();
    let longest = rows
        .iter()
        .map(|row| {
            row.try_get::<String, _>("config").unwrap().len().max(row.try_get::<Vec<u8>, _>("snapshot").unwrap().len())
        })
        .max()
        .unwrap();
    (texts, longest)
}

async fn add_upstreams(store: &Store, names: std::ops::Range<usize>) {
    for i in names {
        store
            .write("add", move |config| {
                config.upstreams.push(upstream(&format!("u{i}")));
                Ok::<_, Infallible>(())
            })
            .await
            .unwrap();
    }
}

async fn a_spec_is_stored_once_across_versions_and_pruned_with_them(db: &TestDb) {
    let store = Store::open_with(&db.url, secrets(), StoreOptions { keep_snapshots: 4, ..StoreOptions::default() })
        .await
        .unwrap();
    let first = fruitshop("Fruit Shop API");
    let added = first.clone();
    store
        .write("add spec", move |config| {
            config.specs.push(added);
            Ok::<_, Infallible>(())
        })
        .await
        .unwrap();
    let json = store.latest_snapshot().await.unwrap().specs[0].json.clone();
    assert!(json.starts_with('{') && json.contains("Fruit Shop API"));
    add_upstreams(&store, 0..3).await; // versions 3 to 5; 2 to 5 kept

    // One row per text (the YAML and its JSON form), none in the versions' rows.
    let (texts, longest) = stored(&store).await;
    assert_eq!(texts, BTreeSet::from([first.content.clone(), json.clone()]));
    assert!(longest < first.content.len() / 4, "a version's row holds {longest} bytes: the spec is inline");
    assert_eq!(count(&store, "SELECT COUNT(*) FROM snapshot_spec_contents").await, 8);
    for version in 2..=5 {
        let config = store.snapshot_config(version).await.unwrap().unwrap();
        assert_eq!(config.specs[0].content, first.content, "version {version}");
        let snapshot = store.snapshot(version).await.unwrap().unwrap();
        assert_eq!(snapshot.specs[0].json, json, "version {version}");
        assert_eq!(snapshot.version, version);
    }
    // The hash and size are those of the snapshot as sent, spec included.
    let summary = &store.list_snapshots(Some(3), 1).await.unwrap()[0];
    let snapshot = store.snapshot(2).await.unwrap().unwrap();
    assert_eq!((summary.hash.as_str(), summary.size_bytes), (snapshot.hash.as_str(), snapshot.encoded_len() as u64));

    // A new text of the spec; once no kept version holds the old one, it is deleted.
    let second = fruitshop("Fruit Shop API, second edition");
    let replaced = second.clone();
    store
        .write("replace spec", move |config| {
            config.specs[0] = replaced;
            Ok::<_, Infallible>(())
        })
        .await
        .unwrap(); // version 6
    assert_eq!(stored(&store).await.0.len(), 4);
    add_upstreams(&store, 3..6).await; // versions 7 to 9; 6 to 9 kept
    let new_json = store.latest_snapshot().await.unwrap().specs[0].json.clone();
    assert_eq!(stored(&store).await.0, BTreeSet::from([second.content.clone(), new_json]));
    assert_eq!(store.snapshot_config(5).await.unwrap(), None);

    // Rollback's source, read back from a store opened afresh: the text is whole.
    store.close().await;
    let reopened = db.open().await;
    assert_eq!(reopened.snapshot_config(6).await.unwrap().unwrap().specs[0].content, second.content);

    // A re-sealed history still refers to the same texts.
    let new_key = SecretBox::from_key_material(OTHER_KEY).unwrap();
    reopened.rotate_secret_key(&new_key).await.unwrap();
    reopened.close().await;
    let rotated = Store::open(&db.url, new_key).await.unwrap();
    assert_eq!(rotated.snapshot_config(7).await.unwrap().unwrap().specs[0].content, second.content);
    assert!(rotated.snapshot(7).await.unwrap().unwrap().specs[0].json.contains("second edition"));
    rotated.close().await;
}
