-- Fleet convergence (issue 24). Keep in step with the other dialect's 0003.

-- The hash of the snapshot a node last NACKed, next to its version: a node of
-- the same build that reconnects is never sent that content again, under any
-- version number (a revert or rollback to it makes a new version, same hash).
ALTER TABLE data_planes ADD COLUMN last_nack_hash TEXT;
