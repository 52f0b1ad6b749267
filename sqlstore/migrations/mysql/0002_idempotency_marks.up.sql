CREATE TABLE IF NOT EXISTS idempotency_records_marks (
    id      BINARY(32)   NOT NULL PRIMARY KEY,
    token   BIGINT       NOT NULL,
    route   VARCHAR(100) NOT NULL,
    request LONGBLOB,
    due_at  DATETIME(6)  NOT NULL,
    tries   INT          NOT NULL DEFAULT 0,
    INDEX idempotency_records_marks_due_idx (due_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
