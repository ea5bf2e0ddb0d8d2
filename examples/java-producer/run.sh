#!/usr/bin/env bash
# Build the Java producer example (once per source version, cached) and run it.
#
#   examples/java-producer/run.sh BOOTSTRAP TOPIC TRANSACTIONAL_ID TAG
#
# EXAMPLE_MAIN names another main class to run: the tests run their drill (src/test) this way.
#
# The jars are the ones the local stack fetched from Maven Central for its broker
# (kafka-clients, jackson, log4j): $KAFKA_LIBS, or the directory that
# ackline.dev.kafka.ensure_jars() returns (it fetches them on first use). The classes are
# compiled into ${XDG_CACHE_HOME:-~/.cache}/ackline/examples/, keyed by the hash of the
# sources and of the classpath; nothing is written inside the repository.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
libs=${KAFKA_LIBS:-}
if [ -z "$libs" ]; then
    python=${PYTHON:-$here/../../.venv/bin/python}
    libs=$("$python" -c 'from ackline.dev.kafka import ensure_jars; print(ensure_jars())')
fi

jar() {  # the one jar of an artifact in $libs, e.g. kafka-clients-4.1.1.jar
    local found
    found=$(find "$libs" -maxdepth 1 -name "$1-[0-9]*.jar" | sort | tail -n 1)
    if [ -z "$found" ]; then
        echo "run.sh: no $1 jar in $libs" >&2
        exit 1
    fi
    printf '%s' "$found"
}
cp=""
for artifact in kafka-clients lz4-java snappy-java zstd-jni slf4j-api log4j-api log4j-core \
        log4j-slf4j-impl jackson-core jackson-databind jackson-annotations; do
    cp="$cp${cp:+:}$(jar "$artifact")"
done

sources=$(find "$here/src" -name '*.java' | sort)
key=$( (cat $sources; echo "$cp"; java -version 2>&1) | sha256sum | cut -c1-16)
base=${XDG_CACHE_HOME:-$HOME/.cache}
case "$base" in /*) ;; *) base=$HOME/.cache ;; esac
classes=$base/ackline/examples/java-producer-$key
if [ ! -f "$classes/.complete" ]; then
    mkdir -p "$(dirname "$classes")"
    tmp=$(mktemp -d "$classes.tmp.XXXXXX")
    # shellcheck disable=SC2086
    javac --release 17 -Xlint:all -d "$tmp" -cp "$cp" $sources
    touch "$tmp/.complete"
    # Atomic: a concurrent build that finished first wins, this one is dropped.
    mv -T "$tmp" "$classes" 2>/dev/null || rm -rf "$tmp"
fi

exec java -Dlog4j2.configurationFile="$here/log4j2.properties" \
    -cp "$classes:$cp" "${EXAMPLE_MAIN:-ackline.example.ActivityProducerExample}" "$@"
