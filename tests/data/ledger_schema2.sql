-- A privacy ledger at schema 2, as dpicl wrote it before its entries held events: written by
-- dpcore.ledger (SCHEMA_VERSION 2) and dumped row for row (sqlite3 iterdump; infinity as 1e999).
-- tests/test_ledger_migration.py opens it with today's ledger. ledger_schema2_show.{json,txt}: what
-- `dpicl ledger show [--json]` printed for it then.
BEGIN TRANSACTION;
CREATE TABLE budgets (
    dataset_id TEXT PRIMARY KEY,
    epsilon    REAL NOT NULL,
    delta      REAL NOT NULL,
    set_at     TEXT NOT NULL
);
INSERT INTO "budgets" VALUES('tickets',50.0,1.0e-05,'2026-11-25T23:00:39+00:00');
CREATE TABLE entries (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    dataset_id       TEXT    NOT NULL,
    content_hash     TEXT    NOT NULL,
    run_id           TEXT    NOT NULL,
    mechanism        TEXT    NOT NULL,
    noise_multiplier REAL    NOT NULL CHECK (noise_multiplier >= 0),
    sampling_rate    REAL    NOT NULL CHECK (sampling_rate > 0 AND sampling_rate <= 1),
    steps            INTEGER NOT NULL CHECK (steps >= 1),
    delta            REAL    NOT NULL,
    epsilon_upper    REAL    NOT NULL,
    purpose          TEXT    NOT NULL,
    status           TEXT    NOT NULL DEFAULT 'charged',
    created_at       TEXT    NOT NULL
);
INSERT INTO "entries" VALUES(1,'tickets','3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f','run-a','gaussian',0.9,0.02,40,1.0e-05,1.47536209449651778413e+00,'pipeline','charged','2026-11-25T23:00:42+00:00');
INSERT INTO "entries" VALUES(2,'tickets','3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f','run-a','gaussian',0.9,0.02,40,1.0e-05,1.47536209449651778413e+00,'audit','charged','2026-11-25T23:00:42+00:00');
INSERT INTO "entries" VALUES(3,'tickets','3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f','run-b','rnm',1.2,0.01,20,1.0e-05,1.80445209455635469097e-01,'generate','charged','2026-11-25T23:00:43+00:00');
INSERT INTO "entries" VALUES(4,'tickets','3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f','run-c','gaussian',40.0,1.0,50,1.0e-05,6.40366917677803737518e-01,'pate','charged','2026-11-25T23:00:44+00:00');
INSERT INTO "entries" VALUES(5,'tickets','3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f','run-c','gaussian',2.82842712474619020204e+01,1.0,50,1.0e-05,9.35672675787116103762e-01,'pate','charged','2026-11-25T23:00:44+00:00');
INSERT INTO "entries" VALUES(6,'tickets','3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f','run-d','gaussian',1.1,0.004,300,1.0e-06,3.99573219640271315444e-01,'dpsgd','charged','2026-11-25T23:00:48+00:00');
INSERT INTO "entries" VALUES(7,'notes','abababababababababababababababababababababababababababababababab','run-e','gaussian',0.0,1.0,1,0.0001,1e999,'baseline','charged','2026-11-25T23:00:48+00:00');
INSERT INTO "entries" VALUES(8,'notes','abababababababababababababababababababababababababababababababab','run-f','rnm',0.0,0.05,10,0.0001,1e999,'generate','charged','2026-11-25T23:00:48+00:00');
INSERT INTO "entries" VALUES(9,'notes','abababababababababababababababababababababababababababababababab','run-g','rnm',2.5,0.05,10,0.0001,1.92013228214155839967e-01,'generate','charged','2026-11-25T23:00:48+00:00');
CREATE TABLE record_sets (
    content_hash TEXT PRIMARY KEY,
    records      INTEGER NOT NULL,
    sketch       TEXT    NOT NULL
);
INSERT INTO "record_sets" VALUES('3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f',40,'0021eb4835a52b8a 0415c29aa98a75a2 045fb721fea97077 3c0f2856f7b832ec 47a2c6be9dab055a 4c1890428b5ffb5a 54962eb0227a41fe 55b0c1eb0862061b 5acb24576cb5bcdd 65372aa14991ee96 687cc9c29a800317 6f24e154463b4b2c 745928b3355ffa6a 7903bc46659feaf6 7930691823327997 8660ada94c096abb 8a848bdab6f88e0a 8bd5cc1983d28459 998aa4020af66df7 9c061dd3f0ebbfd1 9f3253665cad5653 a158ec10b714afda a5e839ddf6d58aca a8e6074d5327ac28 aab08614613a8a69 ab38b670b58df2f6 abba6fcd14cdfd49 b00e28a5d0a727cd b4fc642e525366fb b8269af2115cc1d7 b842ce07e5f3402e bfa69bda8fb07f0a c88095638a0f6030 dc1b71796bcfb3ee eddc8db7bda9de7e f44387ac9abaef05 f5418313bf3872b9 f900bd2b2f7466af fa1fdbca8a5072e4 fbbd6324098006eb');
CREATE INDEX entries_by_dataset ON entries (dataset_id);
CREATE INDEX entries_by_run ON entries (run_id);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('entries',9);
COMMIT;
PRAGMA user_version = 2;
