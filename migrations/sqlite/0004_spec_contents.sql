-- Spec documents stored once (issue 23). Keep in step with the other dialect's 0004.

-- Each spec text a stored snapshot holds (the uploaded YAML or JSON in
-- `config`, its JSON form in `snapshot`), once, under its SHA-256: a row of
-- `snapshots` holds the reference `sluice-spec-content:sha256:<hex>` in its
-- place, so a history of N versions of one spec stores it once, not 2N times.
-- Specs are not secret: they are stored in clear, like the resources' bodies.
CREATE TABLE spec_contents (
    sha256  TEXT PRIMARY KEY,
    content TEXT NOT NULL
);

-- Which versions refer to which texts: retention deletes a version's rows,
-- then the texts no version refers to any more.
CREATE TABLE snapshot_spec_contents (
    version BIGINT NOT NULL,
    sha256  TEXT   NOT NULL,
    PRIMARY KEY (version, sha256)
);
CREATE INDEX snapshot_spec_contents_sha256 ON snapshot_spec_contents (sha256);
