-- Sluice control-plane store, SQLite dialect. Keep the logical schema in
-- step with ../postgres/0001_initial.sql: the store runs the same SQL on both.
-- Times are unix milliseconds (BIGINT) so both dialects read them the same way.

-- The current configuration: one row per resource, body = JSON of the model type.
CREATE TABLE resources (
    kind       TEXT   NOT NULL,
    name       TEXT   NOT NULL,
    body       TEXT   NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (kind, name)
);

-- Every committed configuration, immutable. `config` is the model::Config JSON
-- (for rollback and diff), `snapshot` the prost-encoded v1::Snapshot pushed to data planes.
CREATE TABLE snapshots (
    version    BIGINT PRIMARY KEY,
    hash       TEXT   NOT NULL,
    created_at BIGINT NOT NULL,
    config     TEXT   NOT NULL,
    snapshot   BLOB   NOT NULL,
    size_bytes BIGINT NOT NULL,
    note       TEXT   NOT NULL DEFAULT ''
);

-- Cluster-wide settings created once (e.g. the API-key HMAC key, hex).
CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- Data planes seen by the sync server, with what they run and their last ACK/NACK.
CREATE TABLE data_planes (
    node_id           TEXT    PRIMARY KEY,
    hostname          TEXT    NOT NULL DEFAULT '',
    address           TEXT    NOT NULL DEFAULT '',
    software_version  TEXT    NOT NULL DEFAULT '',
    protocol_version  BIGINT  NOT NULL DEFAULT 0,
    applied_version   BIGINT,
    applied_hash      TEXT,
    last_ack_version  BIGINT,
    last_nack_version BIGINT,
    last_error        TEXT,
    -- INTEGER 0/1, not BOOLEAN: sqlx's Any driver refuses SQLite's declared BOOLEAN type.
    connected         INTEGER NOT NULL DEFAULT 0,
    first_seen        BIGINT  NOT NULL,
    last_seen         BIGINT  NOT NULL
);

-- The purge of silent nodes scans by last_seen.
CREATE INDEX data_planes_last_seen ON data_planes (last_seen);
