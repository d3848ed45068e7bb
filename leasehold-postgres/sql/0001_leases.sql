-- leasehold-postgres schema, version 3 (version 1 had no clock floor and no keep trigger; version 2
-- ran the floor trigger on every acquire and notified every release; migrate() upgrades both in
-- place: every object below is created if missing or replaced, and the wake column is added).
--
-- sql/0001_leases.sql is sql/leases.sql.template rendered for the default table public.leases; it is
-- exactly what `PostgresLeaseStore::migrate()` runs for that table (idempotent). For another
-- table, render sql/leases.sql.template, whose placeholders are the words schema and table in
-- double braces, with your names (migrate() does exactly that, in one pass, after validating
-- them), or let migrate() run it.
--
-- Objects:
--   "public"."leases"              the lease rows (the seed's columns plus ttl_ms)
--   "public"."leases_token_seq"    the generation floor: at least every token of a deleted row
--   "public"."lease_token_floor"()    trigger function that draws every new token
--   "public"."lease_token_keep"()     trigger function that lifts the sequence over deleted rows
--   "public"."leases_fence"        the high-water-mark table (fenced resource)

CREATE SEQUENCE IF NOT EXISTS "public"."leases_token_seq" AS bigint MINVALUE 1 START 1;

CREATE TABLE IF NOT EXISTS "public"."leases" (
    resource_key  text        PRIMARY KEY,
    owner         text        NOT NULL,
    lease_until   timestamptz NOT NULL,
    fencing_token bigint      NOT NULL CHECK (fencing_token > 0),
    -- The TTL of the current grant in milliseconds (NULL for rows written by other tools).
    ttl_ms        bigint      CHECK (ttl_ms > 0),
    -- Whether a release must notify (ADR 0017): 1 once an acquire was refused, 2 after the
    -- release that notified for it, 0 after a release that had no one to notify.
    wake          smallint    NOT NULL DEFAULT 0 CHECK (wake IN (0, 1, 2))
);
-- Version 2 tables gain the wake column (no rewrite: a constant default).
ALTER TABLE "public"."leases"
    ADD COLUMN IF NOT EXISTS wake smallint NOT NULL DEFAULT 0 CHECK (wake IN (0, 1, 2));

-- Tokens never go back: every INSERT, and every UPDATE that changes fencing_token without
-- raising it by more than one, gets
-- greatest(requested token, nextval(sequence), server clock in microseconds since 1970).
-- The library's own takeover writes greatest(old + 1, server clock in microseconds) itself: that
-- raises the token by more than one, and the WHEN clause of the update trigger skips it (no
-- function call on the grant path). A refused acquire, a renewal and a release do not change the
-- token and fire nothing either. The seed's takeover (old + 1) is floored by the trigger.
-- * The row: a takeover requests old + 1, so a key's token grows while its row exists.
-- * The sequence: only grows, and the keep trigger below lifts it over every deleted row's token,
--   so a token drawn after a row was deleted is still greater than every token that row had.
-- * The clock: a failover to an asynchronous standby can lose the newest grants together with the
--   sequence values logged after the standby's last replayed WAL. The promoted server's clock,
--   in microseconds, is still above every token granted before the failover as long as its clock
--   does not lag the old primary's by more than the failover took (ADR 0010).
-- A token written above both floors (by hand, or by a tool that bypassed this trigger) lifts the
-- sequence to it.
CREATE OR REPLACE FUNCTION "public"."lease_token_floor"() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    seq regclass := TG_ARGV[0]::regclass;
    floor_value bigint;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.fencing_token IS NOT DISTINCT FROM OLD.fencing_token THEN
        RETURN NEW; -- renew or release: the generation does not change
    END IF;
    floor_value := greatest(nextval(seq),
                            floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
    IF NEW.fencing_token IS NULL OR NEW.fencing_token <= floor_value THEN
        NEW.fencing_token := floor_value;
    ELSE
        -- Serialise lifts so that two of them cannot move the sequence back.
        PERFORM pg_advisory_xact_lock(1818583411, hashtext(seq::text));
        IF NEW.fencing_token > coalesce(pg_sequence_last_value(seq), 0) THEN
            PERFORM setval(seq, NEW.fencing_token);
        END IF;
    END IF;
    RETURN NEW;
END
$fn$;
COMMENT ON FUNCTION "public"."lease_token_floor"() IS 'leasehold-postgres token floor v3';

-- A deleted (or truncated) row takes its generation with it; lift the sequence to it first, so
-- that the next token for that key is above it without relying on the clock.
CREATE OR REPLACE FUNCTION "public"."lease_token_keep"() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    seq regclass := TG_ARGV[0]::regclass;
    top bigint;
BEGIN
    IF TG_OP = 'DELETE' THEN
        top := OLD.fencing_token;
    ELSE
        EXECUTE format('SELECT max(fencing_token) FROM %I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME)
            INTO top;
    END IF;
    IF top > coalesce(pg_sequence_last_value(seq), 0) THEN
        PERFORM pg_advisory_xact_lock(1818583411, hashtext(seq::text));
        IF top > coalesce(pg_sequence_last_value(seq), 0) THEN
            PERFORM setval(seq, top);
        END IF;
    END IF;
    RETURN OLD;
END
$fn$;

CREATE OR REPLACE TRIGGER "leases_token_floor"
    BEFORE INSERT ON "public"."leases"
    FOR EACH ROW EXECUTE FUNCTION "public"."lease_token_floor"('"public"."leases_token_seq"');

CREATE OR REPLACE TRIGGER "leases_token_floor_update"
    BEFORE UPDATE OF fencing_token ON "public"."leases"
    FOR EACH ROW
    WHEN (NEW.fencing_token IS DISTINCT FROM OLD.fencing_token
          AND NOT (NEW.fencing_token > OLD.fencing_token + 1))
    EXECUTE FUNCTION "public"."lease_token_floor"('"public"."leases_token_seq"');

CREATE OR REPLACE TRIGGER "leases_token_keep"
    BEFORE DELETE ON "public"."leases"
    FOR EACH ROW EXECUTE FUNCTION "public"."lease_token_keep"('"public"."leases_token_seq"');

CREATE OR REPLACE TRIGGER "leases_token_keep_truncate"
    BEFORE TRUNCATE ON "public"."leases"
    FOR EACH STATEMENT EXECUTE FUNCTION "public"."lease_token_keep"('"public"."leases_token_seq"');

-- The high-water-mark table: a resource written with a fencing token but without the lease row.
CREATE TABLE IF NOT EXISTS "public"."leases_fence" (
    resource_key       text   PRIMARY KEY,
    last_fencing_token bigint NOT NULL CHECK (last_fencing_token > 0),
    value              bytea,
    counter            bigint NOT NULL DEFAULT 0,
    accepted           bigint NOT NULL DEFAULT 0
);
