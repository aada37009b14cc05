#!/usr/bin/env bash
# The clients as their users get them. Every artifact is built from a clean copy of the files git tracks in the
# client's folder (never from the checkout's build outputs, node_modules or vendor/), with the ecosystem's own tool,
# and what goes into it is decided by the package's own metadata (pyproject.toml, package.json, go.mod, pom.xml):
#
#   clients/package.sh build [OUT]     OUT/python: the sdist and the wheel (python3 -m build --no-isolation: the sdist
#                                      first, then the wheel built from the unpacked sdist, so a file the sdist lacks
#                                      fails the wheel); OUT/node: the npm tarball (npm pack); OUT/go/module: the Go
#                                      module's files as a version tag publishes them (no vendor/); OUT/java: the
#                                      filter's jar and poms (mvn -o package, Debian's Maven repository)
#   clients/package.sh install [OUT]   build, then install each artifact as a user does, in fresh places, and write
#                                      the commands that start the sample services from them (for the e2e suite,
#                                      clients/e2e/harness.py's "python-wheel", "node-tarball", "go-module" and
#                                      "java-jar"):
#       OUT/python/venv     python3 -m venv --system-site-packages (Debian's psycopg and frameworks are seen; PyPI is
#                           not reachable), the wheel installed with pip --no-index; OUT/python/serve runs the sample
#                           service (copied alone, without the library's sources) on it
#       OUT/node/project    a fresh Node.js project: npm install of the tarball and the service's frameworks;
#                           OUT/node/serve runs the sample service, whose ../src is the installed package's
#       OUT/java/m2         a fresh local Maven repository (Debian's, symlinked, plus the filter's jar installed with
#                           install:install-file); OUT/java/project the sample service alone built against it (mvn -o
#                           package); OUT/java/serve runs it
#       OUT/go/project      a fresh module that requires the client module, vendored (the module's copy and
#                           Debian's sources of its dependencies, clients/go/debian-vendor.sh); OUT/go/payments is the
#                           sample service built from it
#   clients/package.sh check [OUT]     build, then check the artifacts' names and metadata against the sources and the
#                                      Go module's path and README; ends with "client-packages N passed, N failed"
#   Ruby: OUT/ruby/idempotency-pg-VERSION.gem (gem build of idempotency-pg.gemspec); install: gem install --local
#   into OUT/ruby/gems (pg and rack are Debian's gems, seen through GEM_PATH), OUT/ruby/serve runs the sample service
#   (copied alone) on it (clients/e2e/harness.py's "ruby-gem")
# OUT defaults to clients/dist (git-ignored). Needs scripts/install-deps.sh clients ruby release.
set -euo pipefail
clients=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$clients")
cmd=${1:-build}
out=${2:-$clients/dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
py=/usr/bin/python3
"$root/scripts/install-deps.sh" clients java ruby release >&2

# copy_tracked DIR DEST: the files git tracks under clients/DIR (with their working-tree contents), into DEST.
copy_tracked() {
    rm -rf "$2"
    mkdir -p "$2"
    (cd "$root" && git ls-files -z -- "clients/$1" | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
        tar --null -T - -cf -) | tar -C "$2" --strip-components=2 -xf -
}

build() {
    local work
    work=$(mktemp -d /tmp/idem-client-packages.XXXXXX)
    # shellcheck disable=SC2064  # expanded now, on purpose
    trap "rm -rf '$work'" RETURN

    rm -rf "$out/python" "$out/node" "$out/go"
    mkdir -p "$out/python" "$out/node" "$out/go"

    copy_tracked python "$work/python"
    (cd "$work/python" && "$py" -m build --no-isolation --outdir "$out/python" . >"$work/python-build.log" 2>&1) || {
        tail -n 40 "$work/python-build.log"; echo "package.sh: python3 -m build failed" >&2; return 1; }

    copy_tracked node "$work/node"
    (cd "$work/node" && npm pack --silent --pack-destination "$out/node" >/dev/null) || {
        echo "package.sh: npm pack failed" >&2; return 1; }

    rm -rf "$out/ruby"
    mkdir -p "$out/ruby"
    copy_tracked ruby "$work/ruby"
    (cd "$work/ruby" && gem build --silent idempotency-pg.gemspec >"$work/ruby-build.log" 2>&1 &&
        mv idempotency-pg-*.gem "$out/ruby/") || {
        cat "$work/ruby-build.log"; echo "package.sh: gem build failed" >&2; return 1; }
    copy_tracked go "$out/go/module"
    rm -rf "$out/go/module/vendor"

    # Java: mvn -o package of the reactor (the filter's jar, then the sample's), offline against Debian's Maven
    # repository; the filter's jar and its poms (the module's and the parent's) are the artifact
    rm -rf "$out/java"
    mkdir -p "$out/java"
    copy_tracked java "$work/java"
    (cd "$work/java" && mvn -B -q -o -s settings.xml -Dstyle.color=never -DskipTests package >"$work/java-build.log" 2>&1) || {
        tail -n 40 "$work/java-build.log"; echo "package.sh: mvn -o package failed" >&2; return 1; }
    cp "$work"/java/idempotency/target/idempotency-servlet-*.jar "$out/java/"
    cp "$work/java/idempotency/pom.xml" "$out/java/idempotency-servlet.pom"
    cp "$work/java/pom.xml" "$out/java/idempotency-java.pom"

    ls "$out"/python/* "$out"/node/*.tgz "$out"/java/*.jar "$out"/ruby/*.gem
    echo "$out/go/module ($(awk '$1 == "module" {print $2}' "$out/go/module/go.mod"))"
}

install_python() {
    local svc=$out/python/service
    rm -rf "$out/python/venv" "$svc"
    "$py" -m venv --system-site-packages "$out/python/venv"
    "$out/python/venv/bin/pip" install --quiet --no-index --no-deps --disable-pip-version-check "$out"/python/*.whl
    # The sample service alone: the library comes from the wheel or not at all.
    mkdir -p "$svc"
    cp -r "$clients/python/src/payments_service" "$svc/"
    find "$svc" -name __pycache__ -prune -exec rm -rf {} +
    cat >"$out/python/serve" <<EOF
#!/bin/sh
# The sample payment service on the idempotency_pg installed from the wheel into $out/python/venv.
cd '$svc' && PYTHONPATH='$svc' exec '$out/python/venv/bin/python' -m payments_service "\$@"
EOF
    chmod +x "$out/python/serve"
    # The library imported is the venv's.
    (cd "$svc" && "$out/python/venv/bin/python" -c 'import idempotency_pg, sys; sys.exit(0 if "/venv/" in idempotency_pg.__file__ else 1)')
}

install_node() {
    local project=$out/node/project tarball deps
    tarball=$(ls "$out"/node/*.tgz)
    rm -rf "$project"
    mkdir -p "$project"
    # The frameworks and driver the sample service imports, at the versions its package-lock.json pins.
    deps=$(cd "$clients/node" && node -e '
        const lock = require("./package-lock.json").packages;
        const pkg = require("./package.json");
        const names = Object.keys(pkg.peerDependencies || {});
        console.log(names.filter((n) => lock["node_modules/" + n]).map((n) => n + "@" + lock["node_modules/" + n].version).join(" "));')
    (cd "$project" && npm init -y >/dev/null &&
        npm pkg set type=module >/dev/null &&
        # shellcheck disable=SC2086  # a list of name@version
        npm install --silent --no-audit --no-fund --prefer-offline "$tarball" $deps)
    # The sample service, whose imports of ../src/*.js land in the installed package.
    cp -r "$clients/node/service" "$project/service"
    ln -s "node_modules/$(node -p 'require(process.argv[1]).name' "$clients/node/package.json")/src" "$project/src"
    cat >"$out/node/serve" <<EOF
#!/bin/sh
# The sample payment service on the idempotency-pg installed from the tarball into $project.
cd '$project' && exec node service/server.js "\$@"
EOF
    chmod +x "$out/node/serve"
}

install_ruby() {
    local gems=$out/ruby/gems svc=$out/ruby/service
    rm -rf "$gems" "$svc"
    # as a user installs it offline; its dependencies (pg, rack) are Debian's gems, not installed again
    gem install --local --ignore-dependencies --no-document --silent --install-dir "$gems" "$out"/ruby/*.gem
    # The sample service alone: the library comes from the gem or not at all.
    mkdir -p "$svc"
    cp -r "$clients/ruby/service/." "$svc/"
    cat >"$out/ruby/serve" <<EOF
#!/bin/sh
# The sample payment service on the idempotency-pg installed from the gem into $gems.
GEM_PATH='$gems':\$(ruby -e 'print Gem.default_path.join(":")') IDEMPOTENCY_PG_INSTALLED=1 exec sh '$svc/serve' "\$@"
EOF
    chmod +x "$out/ruby/serve"
    # The library loaded is the installed gem's.
    GEM_PATH="$gems:$(ruby -e 'print Gem.default_path.join(":")')" ruby -e \
        'require "idempotency_pg"; exit($LOADED_FEATURES.grep(%r{/idempotency_pg\.rb\z}).first.start_with?(ARGV[0]))' "$gems"
}
install_go() {
    local project=$out/go/project mod
    mod=$(awk '$1 == "module" {print $2; exit}' "$out/go/module/go.mod")
    rm -rf "$project"
    mkdir -p "$project"
    # A fresh module whose only code is a requirement of the client module: its go.mod is what `go get` writes
    # (the client's requirements come along), and vendor/ holds the module as published plus Debian's sources of
    # the dependencies (debian-vendor.sh, run in the client module's copy).
    {
        echo "module example.org/payments-from-module"
        echo
        echo "go $(awk '$1 == "go" {print $2; exit}' "$out/go/module/go.mod")"
        echo
        echo "require $mod v0.0.0"
        sed -n '/^require/,$p' "$out/go/module/go.mod"
    } >"$project/go.mod"
    cat >"$project/tools.go" <<EOF
//go:build tools

// Package tools pins the sample service of the client module as a dependency of this module.
package tools

import _ "$mod/cmd/payments"
EOF
    (cd "$out/go/module" && sh debian-vendor.sh)
    mv "$out/go/module/vendor" "$project/vendor"
    mkdir -p "$project/vendor/$(dirname "$mod")"
    cp -r "$out/go/module" "$project/vendor/$mod"
    {
        echo "# $mod v0.0.0"
        echo "## explicit; go $(awk '$1 == "go" {print $2; exit}' "$out/go/module/go.mod")"
        (cd "$out/go/module" && GOFLAGS= GOPROXY=off GO111MODULE=off GOPATH=/nonexistent \
            go list -e -f '{{.ImportPath}}' ./... 2>/dev/null | sed "s|^_$out/go/module|$mod|")
    } >"$project/vendor/modules.txt.self"
    cat "$project/vendor/modules.txt.self" "$project/vendor/modules.txt" >"$project/vendor/modules.txt.new"
    mv "$project/vendor/modules.txt.new" "$project/vendor/modules.txt"
    rm "$project/vendor/modules.txt.self"
    (cd "$project" && GOFLAGS=-mod=vendor GOPROXY=off GOTOOLCHAIN=local GO111MODULE=on \
        go build -o "$out/go/payments" "$mod/cmd/payments")
}

install_java() {
    local m2=$out/java/m2 project=$out/java/project jar
    jar=$(ls "$out"/java/idempotency-servlet-*.jar)
    rm -rf "$m2" "$project"
    # A fresh local Maven repository: Debian's (symlinked, read only) plus the filter's jar installed as a user
    # installs a jar (install:install-file), its parent pom first
    mkdir -p "$m2"
    cp -rs /usr/share/maven-repo/. "$m2/"
    mvn_out() { mvn -B -q -o -Dstyle.color=never -Dmaven.repo.local="$m2" "$@"; }
    mvn_out install:install-file -Dfile="$out/java/idempotency-java.pom" -DpomFile="$out/java/idempotency-java.pom" -Dpackaging=pom
    mvn_out install:install-file -Dfile="$jar" -DpomFile="$out/java/idempotency-servlet.pom"
    # The sample service alone, its pom's dependency on idempotency-servlet resolved from that repository
    mkdir -p "$project"
    cp -r "$clients/java/payments/src" "$clients/java/payments/pom.xml" "$project/"
    (cd "$project" && mvn_out package)
    cat >"$out/java/serve" <<EOF
#!/bin/sh
# The sample payment service on the idempotency-servlet jar installed into $m2.
exec java -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss512k -jar '$project/target/idempotency-payments-1.4.0.jar' "\$@"
EOF
    chmod +x "$out/java/serve"
    # The filter the sample runs on is the installed jar
    cmp -s "$project/target/lib/$(basename "$jar")" "$jar"
}

check() {
    set +e
    local ok=0 bad=0 name version
    expect() {  # expect WHAT STATUS
        if [ "$2" -eq 0 ]; then ok=$((ok + 1)); echo "ok - $1"; else bad=$((bad + 1)); echo "not ok - $1"; fi
    }
    # Python: the names pyproject.toml gives; the wheel's metadata says the same; the sdist holds what the wheel
    # was built from.
    read -r name version < <("$py" -c '
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
print(p["name"], p["version"])' "$clients/python/pyproject.toml")
    local dist=${name//-/_}
    # setuptools 66 names the sdist as the project is named; later ones normalise it as the wheel's
    [ -f "$out/python/$dist-$version.tar.gz" ] || [ -f "$out/python/$name-$version.tar.gz" ]
    expect "python sdist $name-$version.tar.gz" $?
    local wheel
    wheel=$(ls "$out/python/$dist-$version"-*.whl 2>/dev/null | head -1)
    [ -n "$wheel" ]; expect "python wheel $dist-$version-*.whl" $?
    [ -n "$wheel" ] && "$py" - "$wheel" "$name" "$version" <<'EOF'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
fields = dict(l.split(": ", 1) for l in meta.splitlines() if ": " in l and not l.startswith(" "))
sys.exit(0 if (fields.get("Name"), fields.get("Version")) == (sys.argv[2], sys.argv[3]) else 1)
EOF
    expect "python wheel metadata: Name $name, Version $version" $?

    # Node.js: the tarball npm names from package.json, with every file package.json points at.
    read -r name version < <(node -p 'const p = require(process.argv[1]); p.name + " " + p.version' "$clients/node/package.json")
    local tgz=${name#@}
    tgz=$out/node/${tgz//\//-}-$version.tgz    # npm pack's name: @scope/name becomes scope-name
    [ -f "$tgz" ]; expect "npm tarball $(basename "$tgz")" $?
    [ -f "$tgz" ] && node - "$clients/node/package.json" "$tgz" <<'EOF'
const { execFileSync } = require('node:child_process');
const pkg = require(process.argv[2]);
const files = new Set(execFileSync('tar', ['-tzf', process.argv[3]], { encoding: 'utf8' }).split('\n').map((f) => f.replace(/^package\//, '')));
const wanted = [pkg.main, pkg.types, ...Object.values(pkg.exports || {}).flatMap((e) => (typeof e === 'string' ? [e] : Object.values(e)))];
const missing = wanted.filter(Boolean).map((f) => f.replace(/^\.\//, '')).filter((f) => !files.has(f));
if (missing.length) { console.log('missing from the tarball: ' + missing.join(' ')); process.exit(1); }
EOF
    expect "npm tarball holds main, types and every export of package.json" $?

    # Go: the module path go.mod declares is the one the README tells users to require, and every package of the
    # module imports its siblings by it (a copy published under that path builds).
    local mod
    mod=$(awk '$1 == "module" {print $2; exit}' "$out/go/module/go.mod")
    grep -q "require $mod " "$out/go/module/README.md"
    expect "go README requires the module as go.mod names it ($mod)" $?
    ! grep -rhoE --include='*.go' '"[a-z0-9.-]+\.[a-z]+/idempotency[^"]*"' "$out/go/module" | grep -v "^\"$mod[/\"]"
    expect "go packages import the module's own packages by $mod" $?
    grep -m1 '^## ' "$out/go/module/README.md" | grep -qi 'offline'
    expect "go README: the first section is the offline recipe" $?
    # Java: the jar Maven names from the module's pom, holding the filter; the README's dependency is that one.
    local artifact
    artifact=$(sed -n 's|^  <artifactId>\(.*\)</artifactId>|\1|p' "$clients/java/idempotency/pom.xml" | head -1)
    version=$(sed -n 's|^    <version>\(.*\)</version>|\1|p' "$clients/java/idempotency/pom.xml" | head -1)
    [ -f "$out/java/$artifact-$version.jar" ]; expect "java jar $artifact-$version.jar" $?
    unzip -l "$out/java/$artifact-$version.jar" 2>/dev/null | grep -q 'dev/idempotency/servlet/IdempotencyFilter.class'
    expect "java jar holds dev.idempotency.servlet.IdempotencyFilter" $?
    grep -q "<artifactId>$artifact</artifactId>" "$clients/java/README.md"
    expect "java README depends on $artifact" $?

    # Ruby: the gem named and versioned as the gemspec says, holding every file the library requires.
    read -r name version < <(cd "$clients/ruby" && ruby -e 's = Gem::Specification.load("idempotency-pg.gemspec"); puts "#{s.name} #{s.version}"')
    [ -f "$out/ruby/$name-$version.gem" ]; expect "gem $name-$version.gem" $?
    (cd "$clients/ruby" && tar -xOf "$out/ruby/$name-$version.gem" data.tar.gz | tar -tz | sort >"$out/ruby/files.txt" &&
        ruby -e 'need = ["lib/idempotency_pg.rb"] + File.read("lib/idempotency_pg.rb").scan(/require_relative "(.+)"/).flatten.map { |f| "lib/#{f}.rb" }
                 missing = need - File.readlines(ARGV[0], chomp: true); puts "missing from the gem: #{missing.join(" ")}" unless missing.empty?; exit missing.empty?' "$out/ruby/files.txt")
    expect "gem holds the library's every file" $?
    echo "client-packages $ok passed, $bad failed"
    [ "$bad" -eq 0 ]
}

case $cmd in
    build) build ;;
    install) build && install_python && install_node && install_go && install_java && install_ruby ;;
    check) build && check ;;
    *) echo "usage: clients/package.sh build|install|check [OUT]" >&2; exit 2 ;;
esac
