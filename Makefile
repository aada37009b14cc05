# idempotency: PostgreSQL extension with a C++17 core. Build with PGXS.
EXTENSION = idempotency
MODULE_big = idempotency
DATA = $(wildcard sql/idempotency--*.sql)

CORE_SRCS = $(wildcard src/core/*.cpp)
OBJS = $(patsubst %.c,%.o,$(wildcard src/*.c)) $(CORE_SRCS:.cpp=.o)

PG_CPPFLAGS = -Isrc -Isrc/core
PG_CXXFLAGS = -std=c++17 -Wextra -Wno-unused-parameter
SHLIB_LINK = -lcrypto -lstdc++

# pg_regress: every sql/*.sql except the install scripts, run in file-name order.
REGRESS = $(sort $(patsubst sql/%.sql,%,$(filter-out sql/idempotency--%,$(wildcard sql/*.sql))))
REGRESS_OPTS = --load-extension=idempotency

ISOLATION = $(sort $(patsubst test/isolation/specs/%.spec,%,$(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test/isolation --load-extension=idempotency

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXS compiles C++ to LLVM bitcode without PG_CXXFLAGS; give it the same standard.
COMPILE.cxx.bc += $(PG_CXXFLAGS)

# The core stays free of PostgreSQL headers: no -I to the server include directory.
src/core/%.o: src/core/%.cpp
	$(CXX) $(CXXFLAGS) -fPIC -Isrc/core -c -o $@ $<

.PHONY: unittest
unittest:
	$(MAKE) -C test/unit run
