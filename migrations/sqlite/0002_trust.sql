-- Trust between the planes (issue 23). Keep in step with the other dialect's 0002.
-- Sealing what the earlier schema kept in clear (snapshots, the API-key HMAC
-- key) needs the secret key, so the store does it in Rust at start-up, once,
-- in one transaction (see control-plane/src/store/sealing.rs).

-- Named admin API tokens (`sluice-cp tokens`, /v1/tokens) with their role;
-- only a SHA-256 digest of each token is kept.
CREATE TABLE admin_tokens (
    name         TEXT   PRIMARY KEY,
    role         TEXT   NOT NULL,
    token_sha256 TEXT   NOT NULL UNIQUE,
    created_at   BIGINT NOT NULL,
    created_by   TEXT   NOT NULL DEFAULT ''
);

-- Who made each version: the name of the admin token that wrote it
-- (empty for versions made before tokens had names).
ALTER TABLE snapshots ADD COLUMN author TEXT NOT NULL DEFAULT '';
