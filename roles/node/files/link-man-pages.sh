#!/bin/sh
# link-man-pages.sh SOURCE DEST apply|check
# Links each letsinfer*.1 page in SOURCE (the current release's) into DEST,
# where man looks, and removes links in DEST into SOURCE whose page SOURCE no
# longer has. Prints one line per change ("link NAME" / "unlink NAME"); with
# "check" it only prints them. A file in DEST that is not a link is another
# tool's, and stays.
set -eu
source=$1 dest=$2 mode=$3
for page in "$source"/letsinfer*.1; do
  [ -e "$page" ] || continue
  name=${page##*/}
  if [ -e "$dest/$name" ] && [ ! -L "$dest/$name" ]; then
    continue
  fi
  if [ "$(readlink "$dest/$name" || true)" != "$page" ]; then
    echo "link $name"
    [ "$mode" = check ] || ln -sfn "$page" "$dest/$name"
  fi
done
for link in "$dest"/letsinfer*.1; do
  [ -L "$link" ] || continue
  name=${link##*/}
  case "$(readlink "$link")" in
    "$source"/*) ;;
    *) continue ;;
  esac
  if [ ! -e "$source/$name" ]; then
    echo "unlink $name"
    [ "$mode" = check ] || rm -f "$link"
  fi
done
