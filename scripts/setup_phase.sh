# Sourced by scripts/setup*.sh: one line per phase (what it installs, roughly how long), pip's output in a log file.
#
#   phase "what it does" "~1 min" command args...
#
# prints "[setup] what it does (~1 min) ..." then "done in 42 s". The command's stdout and stderr go to $SETUP_LOG
# (default: a file under ${TMPDIR:-/tmp}, named on the first line): pip's expected noise stays there — the resolver's
# "dependency conflicts" list for the deliberately partial SGLang install (--no-deps), "Location ... is ignored" of
# an index that lacks a package. A phase that fails prints its last 25 log lines and the log's path, and the script
# stops with the command's exit code (set -e): a real failure is never hidden.
if [ -z "${SETUP_LOG:-}" ]; then
  SETUP_LOG=$(mktemp "${TMPDIR:-/tmp}/dsparkhub-setup.XXXXXX.log")
  export SETUP_LOG
  echo "[setup] pip's output goes to $SETUP_LOG"
fi

phase() {
  local what=$1 eta=$2 start rc from
  shift 2
  printf '[setup] %s (%s) ... ' "$what" "$eta"
  echo "=== $what: $*" >> "$SETUP_LOG"
  from=$(wc -l < "$SETUP_LOG")
  start=$(date +%s)
  rc=0
  "$@" >> "$SETUP_LOG" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "FAILED (exit $rc)"
    echo "[setup] its last lines (of $SETUP_LOG):" >&2
    tail -n "+$((from + 1))" "$SETUP_LOG" | tail -n 25 >&2
    echo "[setup] full log: $SETUP_LOG" >&2
    return "$rc"
  fi
  echo "done in $(( $(date +%s) - start )) s"
}
