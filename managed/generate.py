#!/usr/bin/env python3
"""Writes the managed edition (issue 40) from the project's own sources; `make managed` runs it.

The managed edition is extension/idempotency.sql with extension/functions.sql and extension/citus.sql appended
(the C edition's install script, unchanged), where every LANGUAGE C function is replaced by the function of the
same name and argument types in managed/*.sql (SQL and PL/pgSQL only), and so is a SQL or PL/pgSQL function
that managed/ defines again (one that finds its schema through pg_extension, absent under the plain script). A C function that managed/ does not
define yet becomes a PL/pgSQL function of the same signature that raises 0A000 (feature_not_supported), so
every name of the API exists and the unfinished ones say so; `generate.py --missing` lists them. The
functions of managed/*.sql that replace no C function (the helpers, named idem_managed_*) go in just before the
first replaced one; its other statements (procedures, grants) at the end.

Two files, into the directory given (dist/):
  idempotency-pgtle.sql    for psql as a pgtle_admin: registers every released version (managed/releases/) and
                           the one being built with pgtle.install_extension(_version_sql), and the update path
                           from each to the next with pgtle.install_update_path (skipping what is registered
                           already), after which CREATE EXTENSION idempotency and ALTER EXTENSION idempotency
                           UPDATE work;
  idempotency-managed.sql  the same objects as a plain script into the current schema; run again, it replaces
                           the functions and keeps the tables, types and keys.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ["extension/idempotency.sql", "extension/functions.sql", "extension/citus.sql"]
VERSION_RE = re.compile(r"^EXTVERSION\s*=\s*(\S+)", re.M)


def statements(text):
    """Splits SQL text into statements (each with the comments before it), minding quotes and dollar quotes."""
    out, start, i, n = [], 0, 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("--", i):
            i = text.find("\n", i)
            i = n if i < 0 else i + 1
        elif c == "'":
            i += 1
            while i < n:
                if text[i] == "'" and text.startswith("''", i):
                    i += 2
                elif text[i] == "'":
                    i += 1
                    break
                else:
                    i += 1
        elif c == '"':
            i = text.index('"', i + 1) + 1
        elif c == "$":
            m = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$", text[i:])
            if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                tag = m.group(0)
                i = text.index(tag, i + len(tag)) + len(tag)
            else:
                i += 1
        elif c == ";":
            out.append(text[start:i + 1])
            start = i = i + 1
        else:
            i += 1
    rest = text[start:]
    if rest.strip():
        out.append(rest)
    # A SQL-standard body (BEGIN ATOMIC ... END) holds statements of its own: one statement up to its END.
    merged, open_body = [], False
    for piece in out:
        if open_body:
            merged[-1] += piece
            open_body = not re.fullmatch(r"\s*END\s*;\s*", strip_comments(piece), re.I)
        else:
            merged.append(piece)
            open_body = bool(re.search(r"\bBEGIN\s+ATOMIC\b", strip_comments(piece), re.I))
    return merged


def strip_comments(stmt):
    return re.sub(r"--[^\n]*", "", stmt)


FUNC_RE = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+@extschema@\.(\w+)\s*\(", re.I)


def split_args(text):
    args, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            args.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        args.append(cur)
    return args


def function_key(stmt):
    """name(in-argument types) of a CREATE FUNCTION statement, or None."""
    body = strip_comments(stmt)
    m = FUNC_RE.search(body)
    if not m:
        return None
    depth, i = 1, m.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(body[i], 0)
        i += 1
    types = []
    for arg in split_args(body[m.end():i - 1]):
        words = re.split(r"\s+", re.split(r"\s+DEFAULT\s+|\s*=\s*", arg.strip(), flags=re.I)[0].strip())
        if words[0].upper() == "OUT":
            continue
        if words[0].upper() in ("IN", "INOUT", "VARIADIC"):
            words = words[1:]
        typ = words[0] if len(words) == 1 else " ".join(words[1:])
        types.append(typ.lower())
    return "%s(%s)" % (m.group(1), ",".join(types))


def is_c_function(stmt):
    return function_key(stmt) is not None and re.search(r"\bLANGUAGE\s+C\b", strip_comments(stmt), re.I)


def stub(stmt, key):
    """The C function's header with a PL/pgSQL body that raises 0A000."""
    text = re.sub(r"\n?AS\s+'MODULE_PATHNAME'\s*,\s*'\w+'", "", stmt)
    text = re.sub(r"\bLANGUAGE\s+C\b", "LANGUAGE plpgsql", text)
    if not re.search(r"\bSET\s+search_path\b", text):
        text = text.rstrip().rstrip(";") + "\nSET search_path = pg_catalog, pg_temp;"
    name = key.split("(")[0]
    body = ("\nAS $$\nBEGIN\n    RAISE EXCEPTION '%s is not in the managed edition of idempotency yet'\n"
            "        USING ERRCODE = 'feature_not_supported',\n"
            "              HINT = 'managed/SUPPORTED lists what the managed edition has.';\nEND\n$$;" % name)
    return text.rstrip().rstrip(";") + body


# The public functions whose body is a worker's, written in by inline_workers: each call of a function with its fixed
# search_path costs a GUC save and restore and a new namespace path (about 17k instructions; bench/RESULTS.md,
# "The managed edition over the wire"), so these, the ones a request calls, call no worker. managed/claim.sql keeps
# them as the call (checks, then `c := worker(...); RETURN expression of c;` or `RETURN worker(...);`), which is
# what they do.
INLINED = {
    "idem_claim(text,text,interval,text)": "idem_managed_claim",
    "idem_claim_wait(text,text,interval,interval,text)": "idem_managed_claim",
    "idem_complete(text,integer,jsonb,jsonb,text)": "idem_managed_complete",
    "idem_complete_request(text,text,integer,text,jsonb,bytea)": "idem_managed_complete",
}
WORKER_LABEL = "managed_worker"


def function_parts(stmt):
    """(header up to its AS $$, the name, [(mode, name, type, default)], body between the $$)."""
    m = re.search(r"\bAS\s+\$\$", stmt)
    end = stmt.rindex("$$")
    header, body = stmt[:m.end()], stmt[m.end():end]
    fm = FUNC_RE.search(header)
    depth, i = 1, fm.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(header[i], 0)
        i += 1
    params = []
    for arg in split_args(header[fm.end():i - 1]):
        words = strip_comments(arg).split()
        mode = "IN"
        if words[0].upper() in ("IN", "OUT", "INOUT"):
            mode, words = words[0].upper(), words[1:]
        text = " ".join(words[1:])
        typ, default = (re.split(r"\s+DEFAULT\s+", text, flags=re.I) + [None])[:2]
        params.append((mode, words[0], typ, default))
    return header, fm.group(1), params, body


def inline_workers(managed):
    """managed with the functions of INLINED given their worker's body in place of its call."""
    for key, worker in INLINED.items():
        wkey = [k for k in managed if k.startswith(worker + "(")]
        if key not in managed or len(wkey) != 1:
            sys.exit("generate.py: cannot inline %s into %s" % (worker, key))
        header, name, params, body = function_parts(managed[key])
        _, _, wparams, wbody = function_parts(managed[wkey[0]])
        call = re.search(r"(?:\b(\w+)\s*:=\s*|\bRETURN\s+)@extschema@\." + worker + r"\(", body)
        depth, i = 1, call.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(body[i], 0)
            i += 1
        args = [a.strip() for a in split_args(body[call.end():i - 1])]
        stmt_end = body.index(";", i) + 1
        begin = re.search(r"^BEGIN\n", body, re.M)
        checks = body[begin.end():call.start()]
        rest = body[stmt_end:]
        rest = strip_comments(rest[:rest.rindex("END")]).strip()
        record = call.group(1)
        if record:
            # c := worker(...); RETURN expression of c;
            if not re.fullmatch(r"RETURN\b[^;]*;", rest, re.S):
                sys.exit("generate.py: %s: only `RETURN expression;` may follow the call" % key)
            final = re.sub(r"\b%s\." % record, WORKER_LABEL + ".", rest)
        elif rest:
            sys.exit("generate.py: %s: nothing may follow `RETURN %s(...)`" % key, worker)
        own = {p[1] for p in params}
        ins = [p for p in wparams if p[0] == "IN"]
        if len(args) != len(ins):
            sys.exit("generate.py: %s: %d arguments for %s" % (key, len(args), worker))
        decls, same = [], set()
        for (_, pname, ptype, _), arg in zip(ins, args):
            if arg == pname and pname in own:
                same.add(pname)
            elif arg.upper() == "NULL":
                decls.append("    %s %s;\n" % (pname, ptype))
            else:
                # A name of the caller's own as the argument: qualified, since the worker's name may hide it.
                arg = arg if arg not in own else "%s.%s" % (name, arg)
                decls.append("    %s %s := %s;\n" % (pname, ptype, arg))
        decls += ["    %s %s;\n" % (p[1], p[2]) for p in wparams if p[0] == "OUT"]
        wdecl = re.search(r"^DECLARE\n(.*?)^BEGIN\n", wbody, re.M | re.S)
        wdecl_text = wdecl.group(1) if wdecl else ""
        wcode = wbody[(wdecl.end() if wdecl else re.search(r"^BEGIN\n", wbody, re.M).end()):]
        wcode = wcode[:wcode.rindex("END")]
        if record:
            wcode = re.sub(r"\bRETURN\s*;", final, wcode)
            wcode = wcode.rstrip() + "\n    " + final + "\n"
        qualify = lambda m: "%s.%s" % (name if m.group(1) in same else WORKER_LABEL, m.group(1))
        text = re.sub(r"\b%s\.(\w+)" % worker, qualify, wdecl_text + "BEGIN\n" + checks + wcode)
        managed[key] = (header + "\n-- (Written by managed/generate.py: the body of %s, its call inlined.)\n"
                        "<<%s>>\nDECLARE\n" % (worker, WORKER_LABEL) + "".join(decls) + text
                        + "END %s\n$$;" % WORKER_LABEL)
    return managed


def read_managed(managed_dir):
    """The functions of managed/*.sql by name(in-argument types), and its other statements."""
    managed, helpers = {}, []
    for name in sorted(os.listdir(managed_dir)):
        if not name.endswith(".sql"):
            continue
        with open(os.path.join(managed_dir, name)) as f:
            for stmt in statements(f.read()):
                key = function_key(stmt)
                if key is None:
                    if strip_comments(stmt).strip():
                        helpers.append(stmt)
                    continue
                if key in managed:
                    sys.exit("generate.py: %s is defined twice in managed/" % key)
                managed[key] = stmt
    return inline_workers(managed), helpers


def build(managed_dir):
    managed = {}
    helpers = []
    for name in sorted(os.listdir(managed_dir)):
        if not name.endswith(".sql"):
            continue
        with open(os.path.join(managed_dir, name)) as f:
            for stmt in statements(f.read()):
                key = function_key(stmt)
                if key is None:
                    if strip_comments(stmt).strip():
                        helpers.append(stmt)
                    continue
                if key in managed:
                    sys.exit("generate.py: %s is defined twice in managed/" % key)
                managed[key] = stmt
    managed = inline_workers(managed)
    c_keys = set()
    sql_keys = set()
    parts = []
    for src in SOURCES:
        with open(os.path.join(ROOT, src)) as f:
            parts.extend(statements(f.read()))
    out, missing, helpers_done = [], [], False
    for stmt in parts:
        if is_c_function(stmt):
            key = function_key(stmt)
            c_keys.add(key)
            if key in managed:
                if not helpers_done:
                    out.extend(managed[k] for k in managed if k.startswith("idem_managed_"))
                    helpers_done = True
                out.append(managed[key])
            else:
                missing.append(key)
                out.append(stub(stmt, key))
        elif function_key(stmt) in managed:
            # A SQL or PL/pgSQL function of the C edition that finds its schema through pg_extension (absent
            # where the plain script installs): managed/ gives the version that names @extschema@.
            sql_keys.add(function_key(stmt))
            out.append(managed[function_key(stmt)])
        else:
            out.append(stmt)
    # The other statements of managed/ (procedures, grants) after everything, when every object they name exists.
    out.extend("\n" + stmt.lstrip("\n") for stmt in helpers)
    extra = [k for k in managed if k not in c_keys and k not in sql_keys and not k.startswith("idem_managed_")]
    if extra:
        sys.exit("generate.py: managed/ defines %s, which replace no C function (helpers are named "
                 "idem_managed_*)" % ", ".join(extra))
    script = "".join(out)
    script = re.sub(r"^\\echo[^\n]*\n", "", script, flags=re.M)
    return script, missing, len(c_keys) - len(missing)


def version_key(version):
    return tuple(int(n) for n in re.findall(r"\d+", version))


def update_step(managed_dir, old, new, new_script):
    """The managed edition's update script from version old to new: the C edition's update step
    (extension/idempotency--OLD--NEW.sql, when there is one: the tables' changes) with every LANGUAGE C function
    replaced by its managed version (or a stub), after the helpers (idem_managed_*) are dropped, since they may
    change their signatures; then every function, procedure, view, comment and grant of the new version made
    anew (CREATE OR REPLACE), so the update ends with exactly the new version's routines."""
    managed, _ = read_managed(managed_dir)
    out = ["-- idempotency %s -> %s, the managed edition's update, generated by managed/generate.py.\n" % (old, new),
           "DO $idem_update_do$\nDECLARE\n    helper pg_catalog.regprocedure;\nBEGIN\n"
           "    FOR helper IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p\n"
           "                  WHERE p.pronamespace OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace\n"
           "                    AND p.proname OPERATOR(pg_catalog.~) '^idem_managed_' LOOP\n"
           "        EXECUTE pg_catalog.format('DROP ROUTINE %s', helper);\n"
           "    END LOOP;\nEND\n$idem_update_do$;\n"]
    step = os.path.join(ROOT, "extension", "idempotency--%s--%s.sql" % (old, new))
    if os.path.exists(step):
        with open(step) as f:
            for stmt in statements(f.read()):
                if is_c_function(stmt):
                    key = function_key(stmt)
                    out.append(managed[key] if key in managed else stub(stmt, key))
                else:
                    out.append(stmt)
    out.append("\n" + plain_update_part(new_script))
    return re.sub(r"^\\echo[^\n]*\n", "", "".join(out), flags=re.M)


def releases(releases_dir):
    """The frozen versions under releases_dir: {version: install script}, {(old, new): update script}."""
    installs, updates = {}, {}
    if os.path.isdir(releases_dir):
        for name in os.listdir(releases_dir):
            m = re.fullmatch(r"idempotency--([^-]+(?:-[^-]+)*?)(?:--([^-]+(?:-[^-]+)*?))?\.sql", name)
            if not m:
                continue
            with open(os.path.join(releases_dir, name)) as f:
                text = f.read()
            if m.group(2):
                updates[(m.group(1), m.group(2))] = text
            else:
                installs[m.group(1)] = text
    return installs, updates


def dollar_quote(text, tag):
    if "$%s$" % tag in text:
        sys.exit("generate.py: the script contains $%s$" % tag)
    return "$%s$%s$%s$" % (tag, text, tag)


def plain_update_part(script):
    """What a second run of the plain script does: replace the functions, comments, grants and views."""
    keep = []
    for stmt in statements(script):
        body = strip_comments(stmt).strip()
        if re.match(r"CREATE\s+(OR\s+REPLACE\s+)?(FUNCTION|PROCEDURE)\b", body, re.I):
            keep.append(re.sub(r"CREATE\s+(FUNCTION|PROCEDURE)\b", r"CREATE OR REPLACE \1", stmt, count=1,
                               flags=re.I))
        elif re.match(r"CREATE\s+VIEW\b", body, re.I):
            keep.append(re.sub(r"CREATE\s+VIEW\b", "CREATE OR REPLACE VIEW", stmt, count=1, flags=re.I))
        elif re.match(r"(COMMENT\s+ON|REVOKE\s+ALL\s+ON|GRANT\s+EXECUTE\s+ON)\s+(FUNCTION|PROCEDURE)",
                      body, re.I):
            keep.append(stmt)
    return "".join(keep)


def main():
    args = sys.argv[1:]
    if args and args[0] == "--missing":
        _, missing, _ = build(os.path.join(ROOT, "managed"))
        print("\n".join(missing))
        return
    releases_dir = os.path.join(ROOT, "managed", "releases")
    freeze = False
    rest = []
    while args:
        arg = args.pop(0)
        if arg == "--releases" and args:
            releases_dir = args.pop(0)
        elif arg == "--freeze":
            freeze = True
        else:
            rest.append(arg)
    if len(rest) != 1:
        sys.exit("usage: managed/generate.py OUTDIR [--releases DIR] [--freeze] | --missing")
    outdir = rest[0]
    with open(os.path.join(ROOT, "Makefile")) as f:
        version = VERSION_RE.search(f.read()).group(1)
    # Test only (scripts/test-managed.sh, managed-update): another version number, and SQL added to it.
    version = os.environ.get("IDEM_MANAGED_VERSION") or version
    with open(os.path.join(ROOT, "idempotency.control")) as f:
        comment = re.search(r"^comment\s*=\s*'((?:[^']|'')*)'", f.read(), re.M).group(1).replace("''", "'")
    script, missing, replaced = build(os.path.join(ROOT, "managed"))
    if os.environ.get("IDEM_MANAGED_TEST_SQL"):
        with open(os.environ["IDEM_MANAGED_TEST_SQL"]) as f:
            script += "\n" + f.read()

    # The released versions, frozen (managed/README.md, "Releases"): each is registered as it was released, with
    # the update path from each to the next; the version being built is the last, with its update generated.
    installs, updates = releases(releases_dir)
    if version in installs and installs[version] != script:
        sys.exit("generate.py: %s/idempotency--%s.sql is frozen (released) and differs from what managed/ makes "
                 "now: a released version does not change; raise EXTVERSION in the Makefile for the next one"
                 % (releases_dir, version))
    versions = sorted(set(installs) | {version}, key=version_key)
    if versions[-1] != version:
        sys.exit("generate.py: %s has a version after %s" % (releases_dir, version))
    installs[version] = script
    paths = []
    for old, new in zip(versions, versions[1:]):
        if (old, new) in updates:
            paths.append((old, new, updates[(old, new)]))
        elif new == version:
            paths.append((old, new, update_step(os.path.join(ROOT, "managed"), old, new, script)))
        else:
            sys.exit("generate.py: %s has no idempotency--%s--%s.sql" % (releases_dir, old, new))
    if freeze:
        os.makedirs(releases_dir, exist_ok=True)
        with open(os.path.join(releases_dir, "idempotency--%s.sql" % version), "w") as f:
            f.write(script)
        if paths and paths[-1][1] == version:
            with open(os.path.join(releases_dir, "idempotency--%s--%s.sql" % paths[-1][:2]), "w") as f:
                f.write(paths[-1][2])

    os.makedirs(outdir, exist_ok=True)
    header = ("-- idempotency %s, the managed edition (SQL and PL/pgSQL only), generated by `make managed` from\n"
              "-- extension/*.sql and managed/*.sql: do not edit. %d C functions of the API are not in it yet and\n"
              "-- raise 0A000 (managed/SUPPORTED).\n" % (version, len(missing)))

    quote = lambda text: "'%s'" % text.replace("'", "''")
    body = ["DO $idem_pgtle_do$\nDECLARE\n"
            "    registered text[] := ARRAY(SELECT v.version FROM pgtle.available_extension_versions() v\n"
            "                               WHERE v.name OPERATOR(pg_catalog.=) 'idempotency');\n"]
    body += ["    version_%d text := %s;\n" % (n, dollar_quote(installs[v], "idem_tle")) for n, v in enumerate(versions)]
    body += ["    update_%d text := %s;\n" % (n, dollar_quote(text, "idem_tle")) for n, (_, _, text) in enumerate(paths)]
    body.append("BEGIN\n")
    for n, v in enumerate(versions):
        if n == 0:
            body.append("    IF pg_catalog.cardinality(registered) OPERATOR(pg_catalog.=) 0 THEN\n"
                        "        PERFORM pgtle.install_extension('idempotency', %s, %s, version_0);\n"
                        "    ELSIF %s OPERATOR(pg_catalog.<>) ALL (registered) THEN\n"
                        "        PERFORM pgtle.install_extension_version_sql('idempotency', %s, version_0);\n"
                        % (quote(v), quote(comment), quote(v), quote(v)))
        else:
            body.append("    IF %s OPERATOR(pg_catalog.<>) ALL (registered) THEN\n"
                        "        PERFORM pgtle.install_extension_version_sql('idempotency', %s, version_%d);\n"
                        % (quote(v), quote(v), n))
        body.append("    ELSE\n        RAISE NOTICE 'idempotency %s is registered already';\n    END IF;\n" % v)
    for n, (old, new, _) in enumerate(paths):
        body.append("    IF NOT EXISTS (SELECT FROM pgtle.extension_update_paths('idempotency') p\n"
                    "                   WHERE p.source OPERATOR(pg_catalog.=) %s AND p.target OPERATOR(pg_catalog.=) %s\n"
                    "                     AND p.path OPERATOR(pg_catalog.=) %s) THEN\n"
                    "        PERFORM pgtle.install_update_path('idempotency', %s, %s, update_%d);\n"
                    "    END IF;\n" % (quote(old), quote(new), quote("%s--%s" % (old, new)), quote(old), quote(new), n))
    body.append("    IF (SELECT e.default_version FROM pgtle.available_extensions() e\n"
                "        WHERE e.name OPERATOR(pg_catalog.=) 'idempotency') IS DISTINCT FROM %s THEN\n"
                "        PERFORM pgtle.set_default_version('idempotency', %s);\n"
                "    END IF;\nEND\n$idem_pgtle_do$;\n" % (quote(version), quote(version)))
    tle = (header +
           "-- Run with psql as a member of pgtle_admin in each database that will use the extension, after\n"
           "-- CREATE EXTENSION pg_tle; then CREATE EXTENSION idempotency, or ALTER EXTENSION idempotency UPDATE\n"
           "-- where an earlier version is installed. Registers every released version (%s) and the update path\n"
           "-- from each to the next, skipping what is registered already (a version registered with other text\n"
           "-- stays as it is: pgtle.uninstall_extension('idempotency') to register it anew), and makes %s the\n"
           "-- default version.\n" % (", ".join(versions), version) + "".join(body))
    with open(os.path.join(outdir, "idempotency-pgtle.sql"), "w") as f:
        f.write(tle)

    # The plain script: no extension, so nothing to mark for pg_dump (the tables are dumped as any table).
    plain = re.sub(r"SELECT pg_catalog\.pg_extension_config_dump\([^;]*\);\n", "", script)
    with open(os.path.join(outdir, "idempotency-managed.sql"), "w") as f:
        f.write(header +
                "-- Run with psql as a role with CREATE on the schema that is to hold it, which must be the current\n"
                "-- schema (the first of search_path). Run again (the same version or a newer one), it replaces the\n"
                "-- functions and keeps the tables, types and keys.\n"
                "DO $idem_managed_do$\nDECLARE\n"
                "    s text := pg_catalog.quote_ident(pg_catalog.current_schema());\n"
                "    helper pg_catalog.regprocedure;\n"
                "BEGIN\n"
                "    IF s IS NULL THEN\n"
                "        RAISE EXCEPTION 'idempotency: no current schema to install into'\n"
                "            USING ERRCODE = 'invalid_schema_name', HINT = 'SET search_path to the schema first.';\n"
                "    END IF;\n"
                "    IF pg_catalog.to_regclass(s OPERATOR(pg_catalog.||) '.idempotency_keys') IS NULL THEN\n"
                "        EXECUTE pg_catalog.replace(%s, '@extschema@', s);\n"
                "    ELSE\n"
                "        -- The helpers may change their signatures between versions: made anew.\n"
                "        FOR helper IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p\n"
                "                      WHERE p.pronamespace OPERATOR(pg_catalog.=) s::pg_catalog.regnamespace\n"
                "                        AND p.proname OPERATOR(pg_catalog.~) '^idem_managed_' LOOP\n"
                "            EXECUTE pg_catalog.format('DROP ROUTINE %%s', helper);\n"
                "        END LOOP;\n"
                "        EXECUTE pg_catalog.replace(%s, '@extschema@', s);\n"
                "    END IF;\n"
                "END\n$idem_managed_do$;\n" % (dollar_quote(plain, "idem_install"),
                                               dollar_quote(plain_update_part(plain), "idem_update")))
    print("%s/idempotency-pgtle.sql, %s/idempotency-managed.sql: %d C functions replaced, %d not yet" %
          (outdir, outdir, replaced, len(missing)))


if __name__ == "__main__":
    main()
