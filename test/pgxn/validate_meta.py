#!/usr/bin/env python3
"""Checks a PGXN distribution's META.json against the PGXN Meta Spec 1.0 (https://pgxn.org/meta/spec.txt).

    validate_meta.py META.json                 the file alone
    validate_meta.py --zip DIST.zip            META.json inside a distribution zip, and the zip's layout: one top
                                               directory NAME-VERSION/, every provides' file and docfile present

Written from the spec's rules (Debian has no PGXN validator): the required keys (name, version, abstract,
maintainer, license, provides, meta-spec), Terms (at least two characters, no slash, backslash, space or control
character), semantic versions (three numbers: "1.3" is not one), the license keys, prereqs phases, relationships
and version ranges, tags, release_status, and no unknown key outside the x_ and X_ custom keys. Prints one line per
problem and exits 1 if there is any.
"""
import json
import re
import sys
import zipfile

SEMVER = (r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
          r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
          r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?")
VERSION_RE = re.compile(rf"^{SEMVER}$")
RANGE_ITEM_RE = re.compile(rf"^(?:(?:[=!]=|[<>]=?)\s*)?(?:{SEMVER}|0)$")
TERM_RE = re.compile(r"^[^/\\\s\x00-\x1f\x7f]{2,}$")
TAG_RE = re.compile(r"^[^/\\\x00-\x1f\x7f]{2,255}$")
LICENSES = {
    "agpl_3", "apache_1_1", "apache_2_0", "artistic_1", "artistic_2", "bsd", "freebsd", "gfdl_1_2", "gfdl_1_3",
    "gpl_1", "gpl_2", "gpl_3", "lgpl_2_1", "lgpl_3_0", "mit", "mozilla_1_0", "mozilla_1_1", "openssl", "perl_5",
    "postgresql", "qpl_1_0", "ssleay", "sun", "zlib", "open_source", "restricted", "unrestricted", "unknown",
}
REQUIRED = ["name", "version", "abstract", "maintainer", "license", "provides", "meta-spec"]
OPTIONAL = ["description", "generated_by", "tags", "no_index", "prereqs", "release_status", "resources"]
PHASES = {"configure", "build", "test", "runtime", "develop"}
RELATIONSHIPS = {"requires", "recommends", "suggests", "conflicts"}
RESOURCES = {"homepage", "bugtracker", "repository"}


def custom(key):
    return re.match(r"^[xX]_.", key) is not None


def nonempty_string(value):
    return isinstance(value, str) and value != ""


def check(meta, errors):
    def err(msg):
        errors.append(msg)

    if not isinstance(meta, dict):
        err("META.json is not a JSON object")
        return
    for key in REQUIRED:
        if key not in meta:
            err(f"required key '{key}' is missing")
    for key in meta:
        if key not in REQUIRED and key not in OPTIONAL and not custom(key):
            err(f"unknown key '{key}' (custom keys start with x_)")

    if "name" in meta and not (isinstance(meta["name"], str) and TERM_RE.match(meta["name"])):
        err(f"name {meta['name']!r} is not a Term")
    if "version" in meta and not (isinstance(meta["version"], str) and VERSION_RE.match(meta["version"])):
        err(f"version {meta['version']!r} is not a semantic version (MAJOR.MINOR.PATCH)")
    for key in ("abstract", "description", "generated_by"):
        if key in meta and not nonempty_string(meta[key]):
            err(f"{key} must be a non-empty string")

    maintainer = meta.get("maintainer")
    if "maintainer" in meta:
        names = maintainer if isinstance(maintainer, list) else [maintainer]
        if not names or not all(nonempty_string(n) for n in names) or len(set(map(str, names))) != len(names):
            err("maintainer must be a non-empty string or a list of distinct non-empty strings")

    if "license" in meta:
        lic = meta["license"]
        if isinstance(lic, str):
            if lic not in LICENSES:
                err(f"license {lic!r} is not one of the spec's license strings")
        elif isinstance(lic, list):
            if not lic or any(item not in LICENSES for item in lic):
                err(f"license list {lic!r} holds an unknown license string or is empty")
        elif isinstance(lic, dict):
            if not lic or not all(isinstance(v, str) and re.match(r"^[a-z][a-z0-9+.-]*://", v) for v in lic.values()):
                err("license object must map license names to URIs")
        else:
            err("license must be a string, a list or an object")

    provides = meta.get("provides")
    if "provides" in meta:
        if not isinstance(provides, dict) or not provides:
            err("provides must be an object naming at least one extension")
        else:
            for ext, info in provides.items():
                if not TERM_RE.match(ext):
                    err(f"provides: {ext!r} is not a Term")
                if not isinstance(info, dict):
                    err(f"provides.{ext} must be an object")
                    continue
                for key in ("file", "version"):
                    if key not in info:
                        err(f"provides.{ext}: required key '{key}' is missing")
                for key in info:
                    if key not in ("file", "version", "abstract", "docfile") and not custom(key):
                        err(f"provides.{ext}: unknown key '{key}'")
                if "version" in info and not (isinstance(info["version"], str) and VERSION_RE.match(info["version"])):
                    err(f"provides.{ext}.version {info['version']!r} is not a semantic version")
                for key in ("file", "docfile"):
                    if key in info and (not nonempty_string(info[key]) or info[key].startswith("/") or "\\" in info[key]):
                        err(f"provides.{ext}.{key} must be a relative path with / separators")
                if "abstract" in info and not nonempty_string(info["abstract"]):
                    err(f"provides.{ext}.abstract must be a non-empty string")

    if "meta-spec" in meta:
        spec = meta["meta-spec"]
        if not isinstance(spec, dict) or not re.match(r"^1\.0\.\d+$", str(spec.get("version", ""))):
            err("meta-spec must be an object with version 1.0.x")
        elif set(spec) - {"version", "url"}:
            err(f"meta-spec: unknown keys {sorted(set(spec) - {'version', 'url'})}")

    if "prereqs" in meta:
        prereqs = meta["prereqs"]
        if not isinstance(prereqs, dict) or not prereqs:
            err("prereqs must be a non-empty object")
        else:
            for phase, rels in prereqs.items():
                if phase not in PHASES and not custom(phase):
                    err(f"prereqs: unknown phase '{phase}'")
                    continue
                if not isinstance(rels, dict) or not rels:
                    err(f"prereqs.{phase} must be a non-empty object")
                    continue
                for rel, reqs in rels.items():
                    if rel not in RELATIONSHIPS and not custom(rel):
                        err(f"prereqs.{phase}: unknown relationship '{rel}'")
                        continue
                    if not isinstance(reqs, dict):
                        err(f"prereqs.{phase}.{rel} must be an object")
                        continue
                    for name, rng in reqs.items():
                        if not TERM_RE.match(name):
                            err(f"prereqs.{phase}.{rel}: {name!r} is not a Term")
                        if rng == 0:
                            continue
                        if not isinstance(rng, str) or not all(RANGE_ITEM_RE.match(p.strip()) for p in rng.split(",")):
                            err(f"prereqs.{phase}.{rel}.{name}: {rng!r} is not a version range")

    if "tags" in meta:
        tags = meta["tags"]
        if not isinstance(tags, list) or not tags or not all(isinstance(t, str) and TAG_RE.match(t) for t in tags):
            err("tags must be a non-empty list of tags (2 to 255 characters, no slash, backslash or control character)")
    if "release_status" in meta and meta["release_status"] not in ("stable", "testing", "unstable"):
        err(f"release_status {meta['release_status']!r} is not stable, testing or unstable")
    if "resources" in meta:
        res = meta["resources"]
        if not isinstance(res, dict) or any(k not in RESOURCES and not custom(k) for k in res):
            err("resources must be an object of homepage, bugtracker, repository")
    if "no_index" in meta:
        ni = meta["no_index"]
        if not isinstance(ni, dict) or any(k not in ("file", "directory") and not custom(k) for k in ni):
            err("no_index must be an object of file and directory lists")


def check_zip(path, errors):
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        tops = {n.split("/", 1)[0] for n in names}
        if len(tops) != 1:
            errors.append(f"{path}: more than one top directory: {sorted(tops)[:5]}")
            return None
        top = tops.pop()
        if f"{top}/META.json" not in names:
            errors.append(f"{path}: no {top}/META.json")
            return None
        meta = json.loads(z.read(f"{top}/META.json"))
        check(meta, errors)
        expected = f"{meta.get('name')}-{meta.get('version')}"
        if top != expected:
            errors.append(f"{path}: top directory {top!r} is not NAME-VERSION ({expected!r})")
        for ext, info in (meta.get("provides") or {}).items():
            for key in ("file", "docfile"):
                if isinstance(info, dict) and key in info and f"{top}/{info[key]}" not in names:
                    errors.append(f"{path}: provides.{ext}.{key} {info[key]!r} is not in the distribution")
        return meta


def main(argv):
    errors = []
    if len(argv) == 3 and argv[1] == "--zip":
        check_zip(argv[2], errors)
    elif len(argv) == 2:
        with open(argv[1], encoding="utf-8") as f:
            try:
                meta = json.load(f)
            except json.JSONDecodeError as e:
                errors.append(f"{argv[1]}: not JSON: {e}")
                meta = None
        if meta is not None:
            check(meta, errors)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for e in errors:
        print(f"META: {e}")
    if not errors:
        print(f"META: {argv[-1]} follows the PGXN Meta Spec 1.0")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
