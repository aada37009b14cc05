# idempotency: PostgreSQL extension with a C++17 core. Build with PGXS.
EXTENSION = idempotency
EXTVERSION = 1.1
MODULE_big = idempotency

# The install script is written once (extension/idempotency.sql, version 1.0) and every later version is
# reached through an update script, so CREATE EXTENSION and ALTER EXTENSION ... UPDATE run the same statements.
DATA_built = $(EXTENSION)--1.0.sql
DATA = $(wildcard extension/$(EXTENSION)--*--*.sql)

CORE_SRCS = $(wildcard src/core/*.cpp)
OBJS = $(patsubst %.c,%.o,$(wildcard src/*.c)) $(CORE_SRCS:.cpp=.o)

PG_CPPFLAGS = -Isrc -Isrc/core
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

EXTRA_CLEAN = $(EXTENSION)--1.0.sql

# ---- Citus (issue 23), interim until version 1.2 lands: extension/citus.sql as the 1.1 -> 1.2 update script,
# so that ALTER EXTENSION idempotency UPDATE TO '1.2' adds its functions (scripts/test-citus.sh does that).
# Version 1.2 appends extension/citus.sql to both its install script and its update script instead.
DATA_built += $(EXTENSION)--1.1--1.2.sql
EXTRA_CLEAN += $(EXTENSION)--1.1--1.2.sql
# ---- end Citus

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# Set after the include: Makefile.global empties it.
PROVE_FLAGS += -v -I test/faults

# PGXS compiles C++ to LLVM bitcode without PG_CXXFLAGS; give it the same standard.
COMPILE.cxx.bc += $(PG_CXXFLAGS)

$(EXTENSION)--1.0.sql: extension/$(EXTENSION).sql
	cp $< $@

# The core stays free of PostgreSQL headers: no -I to the server include directory.
src/core/%.o: src/core/%.cpp
	$(CXX) $(CXXFLAGS) -fPIC -Isrc/core -c -o $@ $<

.PHONY: unittest prove_installcheck versioncheck
unittest:
	$(MAKE) -C test/unit run

prove_installcheck:
	$(prove_installcheck)

# The control file, META.json and the newest update script must agree with EXTVERSION.
versioncheck:
	@grep -q "^default_version = '$(EXTVERSION)'" $(EXTENSION).control || { echo "$(EXTENSION).control: default_version is not $(EXTVERSION)"; exit 1; }
	@grep -q '"version": "$(EXTVERSION)"' META.json || { echo "META.json: version is not $(EXTVERSION)"; exit 1; }
	@test -f extension/$(EXTENSION)--*--$(EXTVERSION).sql || { echo "no update script to $(EXTVERSION)"; exit 1; }
	@echo "version $(EXTVERSION): control file, META.json and update script agree"

# Citus (issue 23), interim: see above.
$(EXTENSION)--1.1--1.2.sql: extension/citus.sql
	{ printf '%s\n' '\echo Use "ALTER EXTENSION idempotency UPDATE TO '"'"'1.2'"'"'" to load this file. \quit'; cat $<; } >$@
