#!/bin/bash
# PostgreSQL alone under pgbench, as issue 19 measured its peers: a throwaway
# cluster (shared_buffers=256MB, max_connections=300), stock(sku int primary key,
# n bigint) with 10,000 rows that never run out, SKUs drawn zipf 1.1, 64 clients,
# -j 2 -T 6; the conditional UPDATE and the FOR UPDATE transaction, with
# synchronous_commit on and off. The bench's skewed-ample rows are the same sale
# (docs/speed.md, "keylane → Postgres"). Needs Debian's postgresql package; run as
# root (the server runs as the postgres user) or as the user who runs postgres.
set -e
B=${PGBIN:-/usr/lib/postgresql/15/bin}
D=$(mktemp -d /tmp/pgb.XXXX)
PORT=${PORT:-55432}
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -c "$1"; else bash -c "$1"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$D"
trap 'as_pg "$B/pg_ctl -D $D/data stop -m fast" >/dev/null 2>&1; rm -rf "$D"' EXIT
as_pg "$B/initdb -D $D/data -A trust -U postgres >/dev/null"
as_pg "$B/pg_ctl -D $D/data -o '-p $PORT -k $D -c listen_addresses=127.0.0.1 -c shared_buffers=256MB -c max_connections=300' -l $D/log start -w >/dev/null"
P="$B/psql -h 127.0.0.1 -p $PORT -U postgres -q"
$P -c "CREATE TABLE stock(sku int primary key, n bigint); CREATE TABLE orders(id bigserial, sku int, at timestamptz); INSERT INTO stock SELECT i, 1000000000 FROM generate_series(1,10000) i;"
cat > $D/upd.sql <<'X'
\set sku random_zipfian(1, 10000, 1.1)
UPDATE stock SET n = n - 1 WHERE sku = :sku AND n > 0;
X
cat > $D/fu.sql <<'X'
\set sku random_zipfian(1, 10000, 1.1)
BEGIN;
SELECT n FROM stock WHERE sku = :sku FOR UPDATE;
UPDATE stock SET n = n - 1 WHERE sku = :sku AND n > 0;
INSERT INTO orders(sku, at) VALUES (:sku, now());
COMMIT;
X
for sc in upd fu; do for sync in on off; do
  $P -c "ALTER SYSTEM SET synchronous_commit = $sync" -c "SELECT pg_reload_conf()" >/dev/null
  echo "$sc synchronous_commit=$sync: $($B/pgbench -h 127.0.0.1 -p $PORT -U postgres -n -c 64 -j 2 -T 6 -f $D/$sc.sql postgres 2>&1 | grep -E 'tps = ' | head -1)"
done; done
