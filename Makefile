# idempotency: PostgreSQL extension with a C++17 core. Build with PGXS.
EXTENSION = idempotency
EXTVERSION = 1.4
MODULE_big = idempotency

# As pgvector keeps them: extension/idempotency.sql is always the current full script, built into
# idempotency--$(EXTVERSION).sql; every older version is reached through one update script per step, and 1.0
# stays installable (idempotency--1.0.sql) for the update tests. The SQL-language functions live in
# extension/functions.sql, appended to both the install script and the newest update script, so a fresh install
# and an updated one define them from the same text (test/tap/148_install_equals_update.pl compares them).
# extension/citus.sql is appended the same way. Update scripts of released steps are frozen: written out whole
# and never edited (extension/README.md says how to cut the next version).
PREVVERSION = 1.3
SQL_TAIL = extension/functions.sql extension/citus.sql
DATA_built = $(EXTENSION)--$(EXTVERSION).sql $(EXTENSION)--$(PREVVERSION)--$(EXTVERSION).sql
DATA = extension/$(EXTENSION)--1.0.sql extension/$(EXTENSION)--1.0--1.1.sql extension/$(EXTENSION)--1.1--1.2.sql \
       extension/$(EXTENSION)--1.2--1.3.sql

CORE_SRCS = $(wildcard src/core/*.cpp)
OBJS = $(patsubst %.c,%.o,$(wildcard src/*.c)) $(CORE_SRCS:.cpp=.o)

# IDEM_LIBRARY_VERSION (src/maintenance.h) is EXTVERSION: the library checks the SQL's version against it.
PG_CPPFLAGS = -Isrc -Isrc/core -DIDEM_EXTVERSION='"$(EXTVERSION)"'
PG_CXXFLAGS = -std=c++17 -Wextra -Wno-unused-parameter
SHLIB_LINK = -lcrypto -lstdc++

# pg_regress: every sql/*.sql, run in file-name order, against a running server started with
# shared_preload_libraries = 'idempotency'.
REGRESS = $(sort $(patsubst sql/%.sql,%,$(wildcard sql/*.sql)))
REGRESS_OPTS = --load-extension=idempotency

ISOLATION = $(sort $(patsubst test/isolation/specs/%.spec,%,$(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test/isolation --load-extension=idempotency

# The Perl TAP tests make clusters of their own: `make prove_installcheck`, as a user other than root.
PROVE_TESTS = test/tap/*.pl

EXTRA_CLEAN = $(DATA_built)

PG_CONFIG ?= pg_config
# `make managed` alone needs no PostgreSQL build tools (a managed service's user may have none).
ifneq ($(MAKECMDGOALS),managed)
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
endif

# Set after the include: Makefile.global empties it.
PROVE_FLAGS += -v -I test/perl

# PGXS compiles C++ to LLVM bitcode without PG_CXXFLAGS; give it the same standard.
COMPILE.cxx.bc += $(PG_CXXFLAGS)

$(EXTENSION)--$(EXTVERSION).sql: extension/$(EXTENSION).sql $(SQL_TAIL)
	cat $^ >$@

$(EXTENSION)--$(PREVVERSION)--$(EXTVERSION).sql: extension/$(EXTENSION)--$(PREVVERSION)--$(EXTVERSION).sql $(SQL_TAIL)
	cat $^ >$@

# The core stays free of PostgreSQL headers: no -I to the server include directory.
src/core/%.o: src/core/%.cpp
	$(CXX) $(CXXFLAGS) -fPIC -Isrc/core -c -o $@ $<

.PHONY: unittest prove_installcheck versioncheck
unittest:
	$(MAKE) -C test/unit run

prove_installcheck:
	$(prove_installcheck)

# The control file, META.json, debian/changelog and the newest update script must agree with EXTVERSION.
versioncheck:
	@grep -q "^default_version = '$(EXTVERSION)'" $(EXTENSION).control || { echo "$(EXTENSION).control: default_version is not $(EXTVERSION)"; exit 1; }
	@grep -q '"version": "$(DISTVERSION)"' META.json || { echo "META.json: version is not $(DISTVERSION)"; exit 1; }
	@test -f extension/$(EXTENSION)--$(PREVVERSION)--$(EXTVERSION).sql || { echo "no update script to $(EXTVERSION)"; exit 1; }
	@head -1 debian/changelog | grep -q "^$(EXTENSION) ($(EXTVERSION)-" || { echo "debian/changelog: the newest entry is not $(EXTVERSION)-N"; exit 1; }
	@echo "version $(EXTVERSION): control file, META.json, debian/changelog and update script agree"

# PGXN: `make dist` writes dist/idempotency-$(DISTVERSION).zip from the committed tree (git archive of HEAD), as
# PGXN wants it: one top directory named after the distribution and its version, META.json at its top. The META
# spec wants semantic versions (three parts): DISTVERSION is EXTVERSION with a patch number.
# test/pgxn/validate_meta.py checks META.json against the spec; scripts/test-pgxn.sh installs the zip with
# `pgxn install`.
DISTVERSION = $(EXTVERSION).0
.PHONY: dist
# The zip is written under a temporary name and moved into place: a failure (no git checkout) leaves no zip.
dist:
	@git rev-parse --verify -q HEAD >/dev/null || { echo "make dist: needs a git checkout (it archives HEAD)"; exit 1; }
	@mkdir -p dist
	@rm -f dist/$(EXTENSION)-$(DISTVERSION).zip.tmp
	git archive --format zip --prefix=$(EXTENSION)-$(DISTVERSION)/ -o dist/$(EXTENSION)-$(DISTVERSION).zip.tmp HEAD || { rm -f dist/$(EXTENSION)-$(DISTVERSION).zip.tmp; exit 1; }
	@mv dist/$(EXTENSION)-$(DISTVERSION).zip.tmp dist/$(EXTENSION)-$(DISTVERSION).zip
	@echo dist/$(EXTENSION)-$(DISTVERSION).zip

# The managed edition (issue 40, managed/README.md): the same SQL API in SQL and PL/pgSQL only, for servers that
# load no C library (Amazon RDS and Aurora through pg_tle; any PostgreSQL 15+ through a plain script). Written
# from extension/*.sql and managed/*.sql by managed/generate.py (python3; no compiler):
# dist/idempotency-pgtle.sql and dist/idempotency-managed.sql. scripts/test-managed.sh tests both.
.PHONY: managed
managed:
	python3 managed/generate.py dist
