CREATE TABLE IF NOT EXISTS idempotency_records_marks (
    id      BYTEA        NOT NULL PRIMARY KEY,
    token   BIGINT       NOT NULL,
    route   VARCHAR(100) NOT NULL,
    request BYTEA,
    due_at  TIMESTAMPTZ  NOT NULL,
    tries   INTEGER      NOT NULL DEFAULT 0
);

CREATE INDEX IF NOT EXISTS idempotency_records_marks_due_idx ON idempotency_records_marks (due_at);
