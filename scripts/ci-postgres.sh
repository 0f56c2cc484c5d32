#!/usr/bin/env bash
# Starts a PostgreSQL server for CI's store tests (Debian's package, installed if missing) and
# prints the database URL for SLUICE_TEST_POSTGRES_URL. Idempotent: an installed, running cluster,
# its role and its database are reused. Run as root (CI and the dev machines run as root).
set -euo pipefail
if ! command -v pg_ctlcluster >/dev/null; then
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
fi
version=$(ls /etc/postgresql | sort -V | tail -1)
# Debian makes the "main" cluster on install; a machine whose cluster was removed gets a new one.
pg_lsclusters -h | awk '{print $1, $2}' | grep -qx "$version main" || pg_createcluster "$version" main >&2
pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {print $4}' | grep -qx online \
  || pg_ctlcluster "$version" main start >&2
psql_as_postgres() { su postgres -c "psql -qtA -c \"$1\""; }
[[ $(psql_as_postgres "SELECT 1 FROM pg_roles WHERE rolname = 'sluice_ci'") == 1 ]] \
  || psql_as_postgres "CREATE ROLE sluice_ci LOGIN SUPERUSER PASSWORD 'sluice_ci'" >&2
[[ $(psql_as_postgres "SELECT 1 FROM pg_database WHERE datname = 'sluice_ci'") == 1 ]] \
  || su postgres -c "createdb -O sluice_ci sluice_ci" >&2
port=$(pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {print $3}')
echo "postgres://sluice_ci:sluice_ci@127.0.0.1:${port}/sluice_ci"
