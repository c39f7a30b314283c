#!/usr/bin/env bash
# Docker build step: assemble in ROOT the whole file system of the CPU image, which is `FROM scratch` plus this
# tree: the base image's Python (interpreter and standard library), /opt/venv, /srv/mnemo, every shared library
# they load from outside the tree (as ldd resolves them), a loader cache, passwd/group entries for the service
# user, and its state directory /srv/mnemo/state (owned by UID: the SQLite file of the image's MNEMO_STATE_URL).
# No shell and no package manager: a distroless-style image, smaller than the base image alone.
# Usage (in the builder stage): scripts/image-rootfs.sh ROOT UID
set -euo pipefail
root=$1
uid=$2
python=$(command -v python3)
stdlib=$(python3 -B -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')  # -B: no new bytecode
copy() {  # absolute paths -> the same paths under $root, with their modes, owners and symlinks
  tar -C / -cf - "${@#/}" | tar -C "$root" -xpf - --keep-directory-symlink
}
mkdir -p "$root"/{etc,tmp,usr/bin,usr/lib,usr/lib64}
chmod 1777 "$root/tmp"
# Merged /usr: /bin, /lib and /lib64 stay the symlinks they are in the base image.
for link in /bin /lib /lib64; do
  if [ -L "$link" ]; then cp -a "$link" "$root$link"; fi
done
copy "$(dirname "$python")"/python3* "$stdlib" /opt/venv /srv/mnemo
rm -rf "$root$stdlib"/{ensurepip,idlelib,lib2to3,pydoc_data,tkinter,turtledemo,test,distutils,venv}
# Packages the service never imports (no bytecode is written for them when scripts/image_bytecode.py runs it)
rm -rf "$root$stdlib"/{unittest,xmlrpc,curses,dbm,__phello__}
# Extension modules a server never imports, and with them (before the ldd scan below) the libraries only they
# load: terminal UI and line editing (ncurses, readline), Berkeley DB (dbm), NIS (tirpc, Kerberos), crypt(3);
# then CPython's own test modules and audio modules.
rm -f "$root$stdlib"/lib-dynload/{_curses,_curses_panel,readline,_dbm,nis,_crypt}.cpython-*.so
rm -f "$root$stdlib"/lib-dynload/{_test*,_ctypes_test,_xxtestfuzz,_xxsubinterpreters,xxlimited*,audioop,ossaudiodev}.cpython-*.so
if [ -d /etc/python3.11 ]; then copy /etc/python3.11; fi  # Debian's sitecustomize
find "$root" -type f \( -name '*.so' -o -name '*.so.*' -o -perm -u+x \) -print0 \
  | { xargs -0 ldd 2>/dev/null || true; } \
  | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $2 ~ /^\(/ {print $1}' \
  | grep -v "^$root/" \
  | sort -u \
  | while read -r library; do
    # the name the loader asks for, in its directory's real place (merged /usr), and the file it points to
    copy "$(readlink -f "$(dirname "$library")")/$(basename "$library")" "$(readlink -f "$library")"
  done
copy /etc/ld.so.conf /etc/ld.so.conf.d
ldconfig -r "$root"
install -d -o "$uid" -g "$uid" -m 0750 "$root/srv/mnemo/state"
printf 'root:x:0:0:root:/root:/sbin/nologin\nmnemo:x:%s:%s:mnemo:/tmp:/sbin/nologin\n' "$uid" "$uid" >"$root/etc/passwd"
printf 'root:x:0:\nmnemo:x:%s:\n' "$uid" >"$root/etc/group"
