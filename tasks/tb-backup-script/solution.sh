#!/bin/bash
cat > /app/backup.sh <<'SH'
#!/bin/bash
# Copy /app/etc/**/*.conf into /app/backups/<name> (keeping sub-directories) and print the count.
name=$1
dest="/app/backups/$name"
mkdir -p "$dest"
count=0
while IFS= read -r -d '' f; do
  rel=${f#/app/etc/}
  mkdir -p "$dest/$(dirname "$rel")"
  cp "$f" "$dest/$rel"
  count=$((count+1))
done < <(find /app/etc -type f -name '*.conf' -print0)
echo $count
SH
chmod +x /app/backup.sh
cd /app && ./backup.sh "nightly run"
