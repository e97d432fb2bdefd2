# Helpers shared by run.sh and profile.sh (sourced, not run). Needs log/die.
# shellcheck shell=bash

# render TEMPLATE OUT KEY=VALUE...: copy a conf/ template to OUT with every
# {{KEY}} replaced by VALUE (a later KEY=... overrides an earlier one); fails
# if a {{UPPER_CASE}} placeholder is left.
render() {
  local src=$1 out=$2 text kv k
  local -A val=()
  shift 2
  [ -f "$src" ] || die "template missing: $src"
  for kv in "$@"; do val[${kv%%=*}]=${kv#*=}; done
  text=$(<"$src")
  for k in "${!val[@]}"; do
    text=${text//"{{$k}}"/"${val[$k]}"}
  done
  if [[ $text =~ \{\{[A-Z_]+\}\} ]]; then
    die "$src: placeholder ${BASH_REMATCH[0]} not filled"
  fi
  printf '%s\n' "$text" >"$out"
}

# free_ports N: N distinct free loopback ports, space-separated.
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}
