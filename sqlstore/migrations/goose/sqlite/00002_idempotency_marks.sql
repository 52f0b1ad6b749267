-- +goose Up
CREATE TABLE IF NOT EXISTS idempotency_records_marks (
    id      BLOB    NOT NULL PRIMARY KEY,
    token   INTEGER NOT NULL,
    route   TEXT    NOT NULL,
    request BLOB,
    due_at  INTEGER NOT NULL,
    tries   INTEGER NOT NULL DEFAULT 0
);

CREATE INDEX IF NOT EXISTS idempotency_records_marks_due_idx ON idempotency_records_marks (due_at);

-- +goose Down
DROP TABLE IF EXISTS idempotency_records_marks;
