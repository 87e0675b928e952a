//! The `admin_tokens` table: named admin tokens with their role, each kept
//! only as the SHA-256 digest of the token, looked up by that digest when an
//! admin request presents a token other than the startup one.

use sqlx::Row;

use super::{Store, StoreError, now_ms};
use crate::tokens::{AdminToken, Principal, Role, TokenDigest, new_token};

impl Store {
    /// Creates a token named `name` and returns it: the only time it is
    /// seen, since only its digest is stored. `None` when the name is taken.
    pub async fn create_admin_token(
        &self,
        name: &str,
        role: Role,
        created_by: &str,
    ) -> Result<Option<(String, AdminToken)>, StoreError> {
        let (token, digest) = new_token();
        let created_at = now_ms();
        let inserted = sqlx::query(
            "INSERT INTO admin_tokens (name, role, token_sha256, created_at, created_by) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(role.as_str())
        .bind(digest.to_hex())
        .bind(created_at)
        .bind(created_by)
        .execute(&self.inner.pool)
        .await?
        .rows_affected();
        let listed = AdminToken { name: name.to_owned(), role, created_at, created_by: created_by.to_owned() };
        Ok((inserted == 1).then_some((token, listed)))
    }

    /// Every named token, by name.
    pub async fn list_admin_tokens(&self) -> Result<Vec<AdminToken>, StoreError> {
        let rows = sqlx::query("SELECT name, role, created_at, created_by FROM admin_tokens ORDER BY name")
            .fetch_all(&self.inner.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let name: String = row.try_get("name")?;
                Ok(AdminToken {
                    role: role(&name, &row.try_get::<String, _>("role")?)?,
                    name,
                    created_at: row.try_get("created_at")?,
                    created_by: row.try_get("created_by")?,
                })
            })
            .collect()
    }

    /// Deletes the token named `name`; false when there was none.
    pub async fn revoke_admin_token(&self, name: &str) -> Result<bool, StoreError> {
        let deleted =
            sqlx::query("DELETE FROM admin_tokens WHERE name = $1").bind(name).execute(&self.inner.pool).await?;
        Ok(deleted.rows_affected() > 0)
    }

    /// The named token whose digest this is. An equality lookup on a digest
    /// of a 256-bit random token: nothing about a token can be learnt from
    /// how long the lookup takes.
    pub async fn find_admin_token(&self, digest: &TokenDigest) -> Result<Option<Principal>, StoreError> {
        let row = sqlx::query("SELECT name, role FROM admin_tokens WHERE token_sha256 = $1")
            .bind(digest.to_hex())
            .fetch_optional(&self.inner.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let name: String = row.try_get("name")?;
        Ok(Some(Principal { role: role(&name, &row.try_get::<String, _>("role")?)?, name }))
    }
}

fn role(name: &str, text: &str) -> Result<Role, StoreError> {
    Role::parse(text).ok_or_else(|| StoreError::CorruptResource {
        kind: "admin token".into(),
        name: name.to_owned(),
        reason: format!("unknown role `{text}`"),
    })
}
