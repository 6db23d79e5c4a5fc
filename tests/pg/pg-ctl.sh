#!/usr/bin/env bash
# pg-ctl.sh ARG... — pg_ctl on the cluster of with-postgres.sh (its
# folder LG_PG_DIR, its binaries LG_PGBIN; both exported there, with this
# script as LG_PG_CTL), as the user the server runs as: a test that stops
# or restarts its PostgreSQL says only how ("$LG_PG_CTL" -m fast -w stop).
set -u
cmd=("${LG_PGBIN:?run under tests/pg/with-postgres.sh}/pg_ctl" -D "${LG_PG_DIR:?run under tests/pg/with-postgres.sh}/data" "$@")
if [ "$(id -u)" = 0 ]; then exec runuser -u postgres -- "${cmd[@]}"; fi
exec "${cmd[@]}"
