# Sourced by the scripts: make .venv (Python 3.10+) and install the project with extras.
# Re-installs only when pyproject.toml or the requested extras change.
ensure_venv() {
  local extras="$1"
  local python="${PYTHON:-python3}"
  local stamp=".venv/.installed-$(echo "$extras" | tr ',' '-')"
  if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
  fi
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    case ",$extras," in
      *,mysql,*) ensure_mysql_headers ;;
    esac
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$extras]"
    touch "$stamp"
  fi
}

# mysqlclient compiles against the MariaDB/MySQL client library.
ensure_mysql_headers() {
  if pkg-config --exists libmariadb 2>/dev/null || pkg-config --exists mysqlclient 2>/dev/null; then
    return
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    source "$(dirname "${BASH_SOURCE[0]}")/_apt.sh"
    apt_install "the MariaDB client headers, which mysqlclient compiles against" \
      libmariadb-dev pkg-config
  else
    echo "mysqlclient needs the MariaDB client headers: install libmariadb-dev and pkg-config" >&2
    exit 1
  fi
}
