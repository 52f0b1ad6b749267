-- +goose Up
CREATE TABLE IF NOT EXISTS idempotency_records (
    id          BYTEA        NOT NULL PRIMARY KEY,
    caller      VARCHAR(255) NOT NULL,
    scope       VARCHAR(255) NOT NULL,
    idem_key    VARCHAR(255) NOT NULL,
    fingerprint BYTEA,
    state       SMALLINT     NOT NULL,
    token       BIGINT       NOT NULL,
    attempt     INTEGER      NOT NULL,
    lease_until TIMESTAMPTZ,
    expires_at  TIMESTAMPTZ  NOT NULL,
    created_at  TIMESTAMPTZ  NOT NULL,
    status      INTEGER      NOT NULL DEFAULT 0,
    response    BYTEA
);

CREATE INDEX IF NOT EXISTS idempotency_records_expires_at_idx ON idempotency_records (expires_at);

-- +goose Down
DROP TABLE IF EXISTS idempotency_records;
