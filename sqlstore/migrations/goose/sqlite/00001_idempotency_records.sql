-- +goose Up
CREATE TABLE IF NOT EXISTS idempotency_records (
    id          BLOB    NOT NULL PRIMARY KEY,
    caller      TEXT    NOT NULL,
    scope       TEXT    NOT NULL,
    idem_key    TEXT    NOT NULL,
    fingerprint BLOB,
    state       INTEGER NOT NULL,
    token       INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    lease_until INTEGER,
    expires_at  INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    status      INTEGER NOT NULL DEFAULT 0,
    response    BLOB
);

CREATE INDEX IF NOT EXISTS idempotency_records_expires_at_idx ON idempotency_records (expires_at);

-- +goose Down
DROP TABLE IF EXISTS idempotency_records;
