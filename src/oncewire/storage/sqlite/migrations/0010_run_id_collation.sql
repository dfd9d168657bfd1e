-- PostgreSQL's 0010 makes every run_id compare bytewise (COLLATE "C"). SQLite's TEXT columns
-- always compared bytewise (the BINARY collation), so there is nothing to change here: this file
-- keeps the number, so that a schema version names the same schema on both backends.
SELECT 1;
