-- +goose Up
CREATE TABLE IF NOT EXISTS idempotency_records (
    id          BINARY(32)   NOT NULL PRIMARY KEY,
    caller      VARCHAR(255) NOT NULL,
    scope       VARCHAR(255) NOT NULL,
    idem_key    VARCHAR(255) NOT NULL,
    fingerprint BLOB,
    state       SMALLINT     NOT NULL,
    token       BIGINT       NOT NULL,
    attempt     INT          NOT NULL,
    lease_until DATETIME(6),
    expires_at  DATETIME(6)  NOT NULL,
    created_at  DATETIME(6)  NOT NULL,
    status      INT          NOT NULL DEFAULT 0,
    response    LONGBLOB,
    INDEX idempotency_records_expires_at_idx (expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- +goose Down
DROP TABLE IF EXISTS idempotency_records;
