# esd: one GNU Makefile for the library, the programs, the tests and the benchmarks.
#
#   make                     build common/libesd.a and ctl/esctl (installs nothing)
#   make deps                install the build dependencies (root; else the apt-get line)
#   make test-deps           also the test tools and the real Data-Juicer and Ray
#   make check               test-deps, modcheck, errcase, unit tests (check) and integration scripts
#   make modcheck            the modules' layers; fails on a dependency cycle
#   make errcase             fails on an error text that starts upper-case or ends with a period
#   make format-check        .clang-format and .editorconfig over the tree (make format: rewrite)
#   make demo                two daemons as two nodes on the real Data-Juicer and Ray
#                            (STANDIN=1: the test stand-in mini-dj, in seconds)
#   make fuzz                libFuzzer targets, FUZZ_SECONDS each (clang)
#   make bench               benchmarks in bench/ (print ratios)
#   make valgrind            unit suites under valgrind
#   make install             PREFIX, DESTDIR, BINDIR, SBINDIR, LIBEXECDIR, MANDIR, DATADIR, SYSCONFDIR,
#                            UNITDIR, SYSUSERSDIR, CATALOGDIR, BASHCOMPDIR (make uninstall: the same)
#
# Knobs: V=1 (echo commands), WERROR=1, SANITIZE=address,undefined,
# CC, CFLAGS, LDFLAGS, PKG_CONFIG.

CC          ?= cc
PKG_CONFIG  ?= pkg-config
PREFIX      ?= /usr/local
BINDIR      ?= $(PREFIX)/bin
SBINDIR     ?= $(PREFIX)/sbin
DATADIR     ?= $(PREFIX)/share
# esd-dj (daemon/esd-dj.py), the attempts' runner of Data-Juicer, goes to
# $(LIBEXECDIR)/esd.
LIBEXECDIR  ?= $(PREFIX)/lib
MANDIR      ?= $(DATADIR)/man
SYSCONFDIR  ?= /etc
# systemd's own directories (systemd.pc), whatever PREFIX is.
UNITDIR     ?= $(shell $(PKG_CONFIG) --variable=systemdsystemunitdir systemd 2>/dev/null || echo /lib/systemd/system)
SYSUSERSDIR ?= $(shell $(PKG_CONFIG) --variable=sysusersdir systemd 2>/dev/null || echo /usr/lib/sysusers.d)
# the journal's message catalog (journalctl -x); journalctl --update-catalog
# reads it
CATALOGDIR  ?= $(shell $(PKG_CONFIG) --variable=catalogdir systemd 2>/dev/null || echo /usr/lib/systemd/catalog)
BASHCOMPDIR ?= $(DATADIR)/bash-completion/completions
DESTDIR     ?=
FUZZ_SECONDS ?= 60
CLANG       ?= clang

ifeq ($(V),1)
Q :=
else
Q := @
endif

# libcjson, yaml-0.1, libcrypto, zlib and libzstd (prepare's compressed
# inputs) have .pc files; libev does not on Debian.
PKGS := libcjson yaml-0.1 libcrypto zlib libzstd
PKG_CFLAGS := $(shell $(PKG_CONFIG) --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell $(PKG_CONFIG) --libs $(PKGS) 2>/dev/null || echo -lcjson -lyaml -lcrypto -lz -lzstd)
CHECK_CFLAGS := $(shell $(PKG_CONFIG) --cflags check 2>/dev/null)
CHECK_LIBS   := $(shell $(PKG_CONFIG) --libs check 2>/dev/null || echo -lcheck -lsubunit -lm -lrt -lpthread)
EV_LIBS      := $(shell $(PKG_CONFIG) --libs libev 2>/dev/null || echo -lev)

WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
        -Wformat=2 -Wpointer-arith -Wcast-qual -Wwrite-strings -Wvla \
        -Wno-unused-parameter
OPT ?= -O2 -g
BASE_CFLAGS := -std=c11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -pthread $(OPT) $(WARN) \
        $(PKG_CFLAGS) $(shell $(PKG_CONFIG) --cflags libsystemd 2>/dev/null)
ifeq ($(WERROR),1)
BASE_CFLAGS += -Werror
endif
ifneq ($(SANITIZE),)
BASE_CFLAGS += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
BASE_LDFLAGS += -fsanitize=$(SANITIZE)
endif
# The layering, by include path: a folder's code sees its own headers and
# those of the folders below it, no other (scripts/modcheck checks the rest:
# no cycle between modules). common/ is the library; the daemon and esctl
# both stand on it and never on each other; the unit suites test modules
# of common/ and daemon/; the tools, benchmarks and fuzz targets use
# common/ (fuzz_ctl the daemon too).
COMMON_INC := -iquote common
DAEMON_INC := -iquote daemon -iquote common
CTL_INC    := -iquote ctl -iquote common
UNIT_INC   := -iquote tests/unit -iquote common -iquote daemon
ALL_CFLAGS  = $(BASE_CFLAGS) -DESD_LIBEXECDIR='"$(LIBEXECDIR)/esd"' $(CFLAGS)
ALL_LDFLAGS = -pthread $(BASE_LDFLAGS) $(LDFLAGS)

# Object files of different flavours live apart so a sanitizer build never
# links against a plain one.
comma := ,
BUILD := build/$(if $(SANITIZE),san-$(subst $(comma),-,$(SANITIZE)),default)

COMMON_SRC := $(sort $(wildcard common/*.c))
COMMON_OBJ := $(COMMON_SRC:%.c=$(BUILD)/%.o)
LIBESD     := $(BUILD)/libesd.a

# The daemon: everything but main.c goes into libesdd.a, which the unit
# tests link too.
DAEMON_SRC    := $(sort $(wildcard daemon/*.c))
DAEMON_OBJ    := $(DAEMON_SRC:%.c=$(BUILD)/%.o)
DAEMON_LIBOBJ := $(filter-out $(BUILD)/daemon/main.o,$(DAEMON_OBJ))
LIBESDD       := $(BUILD)/libesdd.a
ESD           := $(BUILD)/esd
SD_CFLAGS     := $(shell $(PKG_CONFIG) --cflags libsystemd 2>/dev/null)
SD_LIBS       := $(shell $(PKG_CONFIG) --libs libsystemd 2>/dev/null || echo -lsystemd)
DAEMON_LIBS   := $(EV_LIBS) $(SD_LIBS)

CTL_SRC := $(sort $(wildcard ctl/*.c))
CTL_OBJ := $(CTL_SRC:%.c=$(BUILD)/%.o)
ESCTL   := $(BUILD)/esctl

UNIT_SRC   := $(sort $(wildcard tests/unit/check_*.c))
UNIT_BINS  := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
UNIT_HELP  := $(filter-out $(UNIT_SRC),$(sort $(wildcard tests/unit/*.c)))
UNIT_HOBJ  := $(UNIT_HELP:%.c=$(BUILD)/%.o)

TOOL_SRC    := $(sort $(wildcard tests/tools/*.c))
TOOL_BINS   := $(TOOL_SRC:tests/tools/%.c=$(BUILD)/tools/%)
# INTEGRATION_SKIP: names of scripts (without .sh) not to run, e.g. in a
# sanitizer pass those that build their own binaries or check only docs.
INTEGRATION := $(filter-out $(INTEGRATION_SKIP:%=tests/integration/%.sh),\
                 $(sort $(wildcard tests/integration/*.sh)))
FUZZ_SRC    := $(sort $(wildcard tests/fuzz/fuzz_*.c))

.PHONY: all modcheck errcase format format-check deps depcheck depcheck-unit depcheck-fuzz test-deps tools check demo unit valgrind integration fuzz fuzz-build bench install uninstall clean distclean
ESD_DJ := $(BUILD)/esd-dj
all: $(ESCTL) $(ESD) $(ESD_DJ)
	$(Q)ln -sf $(CURDIR)/$(ESCTL) esctl
	$(Q)ln -sf $(CURDIR)/$(ESD) esd

# Installs missing Debian build dependencies when run as root, otherwise
# prints the exact apt-get line and fails. Only deps, test-deps, check and
# demo install anything.
deps:
	$(Q)scripts/deps

# Every other build only checks, before the first compiler runs, and fails
# with one line naming the missing packages (order-only: a check never
# makes anything out of date). make check and make demo, the README's
# newcomer commands, install first.
depcheck: $(if $(filter check,$(MAKECMDGOALS)),test-deps,$(if $(filter demo,$(MAKECMDGOALS)),deps))
	$(Q)PKG_CONFIG='$(PKG_CONFIG)' CC='$(CC)' scripts/deps --check
depcheck-unit: depcheck
	$(Q)PKG_CONFIG='$(PKG_CONFIG)' CC='$(CC)' scripts/deps --check --unit
$(COMMON_OBJ) $(DAEMON_OBJ) $(CTL_OBJ) $(TOOL_BINS): | depcheck
$(UNIT_HOBJ) $(UNIT_BINS): | depcheck-unit

# $(call compile,INCLUDE_FLAGS): one object of a folder, with its folder's
# include paths.
define compile
	@mkdir -p $(dir $@)
	$(if $(Q),@echo "  CC      $<")
	$(Q)$(CC) $(ALL_CFLAGS) $(1) -MMD -MP -c -o $@ $<
endef
$(COMMON_OBJ): $(BUILD)/%.o: %.c
	$(call compile,$(COMMON_INC))
$(DAEMON_OBJ): $(BUILD)/%.o: %.c
	$(call compile,$(DAEMON_INC))
$(CTL_OBJ): $(BUILD)/%.o: %.c
	$(call compile,$(CTL_INC))
$(UNIT_HOBJ): $(BUILD)/%.o: %.c
	$(call compile,$(UNIT_INC))

$(LIBESD): $(COMMON_OBJ)
	$(if $(Q),@echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIBESDD): $(DAEMON_LIBOBJ)
	$(if $(Q),@echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

$(ESD): $(BUILD)/daemon/main.o $(LIBESDD) $(LIBESD)
	$(if $(Q),@echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $< $(LIBESDD) $(LIBESD) $(PKG_LIBS) $(DAEMON_LIBS) -lm

# (next to esd and esctl, where they look for it first)
$(ESD_DJ): daemon/esd-dj.py
	@mkdir -p $(dir $@)
	$(Q)install -m 0755 $< $@

$(ESCTL): $(CTL_OBJ) $(LIBESD)
	$(if $(Q),@echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $(CTL_OBJ) $(LIBESD) $(PKG_LIBS) -lm

$(BUILD)/tests/%: tests/unit/%.c $(UNIT_HOBJ) $(LIBESDD) $(LIBESD)
	@mkdir -p $(dir $@)
	$(if $(Q),@echo "  CC/LD   $<")
	$(Q)$(CC) $(ALL_CFLAGS) $(UNIT_INC) $(CHECK_CFLAGS) -MMD -MP -MF $@.d -o $@ $< \
		$(UNIT_HOBJ) $(ALL_LDFLAGS) $(LIBESDD) $(LIBESD) $(PKG_LIBS) $(DAEMON_LIBS) \
		$(CHECK_LIBS) -lm

# Test tools written in C (tests/tools/*.c), linked with libesd.
$(BUILD)/tools/%: tests/tools/%.c $(LIBESD)
	@mkdir -p $(dir $@)
	$(if $(Q),@echo "  CC/LD   $<")
	$(Q)$(CC) $(ALL_CFLAGS) $(COMMON_INC) -MMD -MP -MF $@.d -o $@ $< $(ALL_LDFLAGS) $(LIBESD) $(PKG_LIBS) -lm
tools: $(TOOL_BINS)

# Benchmark helpers written in C (bench/*.c).
BENCH_SRC  := $(sort $(wildcard bench/*.c))
BENCH_BINS := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
$(BUILD)/bench/%: bench/%.c $(LIBESD)
	@mkdir -p $(dir $@)
	$(if $(Q),@echo "  CC/LD   $<")
	$(Q)$(CC) $(ALL_CFLAGS) $(COMMON_INC) -MMD -MP -MF $@.d -o $@ $< $(ALL_LDFLAGS) $(LIBESD) $(PKG_LIBS) -lm

# check: first the static checks of the tree, which take a second and stop
# it when they fail (modcheck: the module graph; errcase: the case of the
# error texts); then every unit suite (check prints its own summary line)
# and every integration script, all of them even if one fails; the target
# fails if any did. It installs what the tests need first (test-deps).
check: all modcheck errcase unit integration

# Every error text of common/, daemon/ and ctl/ starts lower-case and has no
# trailing period, but for the reference's own texts (scripts/errcase.allow).
errcase:
	$(Q)scripts/errcase

# No cycle between modules, by #include and by the symbols of the built
# objects, and no folder using one it may not (scripts/modcheck; it prints
# the layers).
modcheck: $(COMMON_OBJ) $(DAEMON_OBJ) $(CTL_OBJ)
	$(Q)scripts/modcheck . $(BUILD)

# What the tests need beyond the build: the tools (mandoc, valgrind,
# faketime, systemd-container, debhelper, lintian, …; as root, or the
# apt-get line to run) and the real Data-Juicer and Ray in .venv
# (scripts/venv: the first run downloads them, later runs take a second).
# NO_REAL=1 leaves the venv out; the real-stack tests then say they skip.
test-deps: deps
	$(Q)scripts/deps --tools
	$(Q)$(if $(NO_REAL),echo "esd: NO_REAL=1: the real Data-Juicer and Ray are not installed; their tests skip",scripts/venv)

# The newcomer's demo (scripts/demo): two esd daemons as two nodes work one
# job of etc/recipes/cpu-text.yaml on the real Data-Juicer and Ray, which
# scripts/venv installs into .venv on the first run. STANDIN=1: the test
# stand-in mini-dj instead (not Data-Juicer), in seconds. DEMO_KEEP=1 keeps
# its workspace.
demo: all $(if $(STANDIN),tools)
	$(Q)ESD=$(CURDIR)/$(ESD) ESCTL=$(CURDIR)/$(ESCTL) TOOLS=$(CURDIR)/$(BUILD)/tools \
		STANDIN=$(STANDIN) scripts/demo

unit: $(UNIT_BINS)
	$(Q)fail=0; for t in $(UNIT_BINS); do \
		echo "== $$t"; \
		CK_DEFAULT_TIMEOUT=$${CK_DEFAULT_TIMEOUT:-60} ESD_TEST_DATA=$(CURDIR)/tests/data $$t || fail=1; \
	done; exit $$fail

# The unit suites again under valgrind. Check's fork mode stays on (tests
# that expect a signal need it): valgrind follows each forked test, and an
# error or a leak there makes that test fail with --error-exitcode. The
# suites run VALGRIND_JOBS at a time (the CPUs), each printed when it ends.
VALGRIND_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
VALGRIND := valgrind -q --leak-check=full --show-leak-kinds=definite,indirect \
	--errors-for-leak-kinds=definite,indirect --error-exitcode=99
valgrind: $(UNIT_BINS)
	$(Q)command -v valgrind >/dev/null || \
		{ echo "esd: missing test tool: valgrind; run \`make test-deps\` (as root) to install it" >&2; exit 1; }
	$(Q)mkdir -p $(BUILD)/valgrind && printf '%s\n' $(UNIT_BINS) | \
		VG='$(VALGRIND)' LOGS=$(BUILD)/valgrind ESD_TEST_DATA=$(CURDIR)/tests/data \
		xargs -P $(VALGRIND_JOBS) -I{} sh -c \
		'l=$$LOGS/$$(basename {}).log; CK_DEFAULT_TIMEOUT=600 $$VG {} >$$l 2>&1; rc=$$?; \
		 echo "== valgrind {}"; cat $$l; [ $$rc -eq 0 ] || echo "FAIL: valgrind {} (exit status $$rc)"; \
		 exit $$((rc != 0))' || { echo "valgrind: a suite failed (FAIL above)"; exit 1; }

# integration: every script (tests/integration/run prints a tally at the
# end), or TESTS="nodes history" a few of them; INTEGRATION_SKIP applies.
INTEGRATION_RUN := $(filter-out $(INTEGRATION_SKIP),\
	$(or $(TESTS),$(INTEGRATION:tests/integration/%.sh=%)))
integration: all tools test-deps
	$(Q)ESCTL=$(CURDIR)/$(ESCTL) ESD=$(CURDIR)/$(ESD) TOP=$(CURDIR) \
		JSONL_CHECK=$(CURDIR)/$(BUILD)/tools/jsonl-check \
		bash tests/integration/run $(INTEGRATION_RUN)

# libFuzzer targets are built with clang against the library sources
# directly (the fuzzer needs its own instrumentation on every object).
FUZZ_BUILD := build/fuzz
FUZZ_BINS  := $(FUZZ_SRC:tests/fuzz/%.c=$(FUZZ_BUILD)/%)
$(FUZZ_BUILD)/%: tests/fuzz/%.c $(COMMON_SRC)
	@mkdir -p $(dir $@)
	$(if $(Q),@echo "  FUZZ    $<")
	$(Q)$(CLANG) -std=c11 -D_GNU_SOURCE -g -O1 -Icommon $(PKG_CFLAGS) \
		-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
		-o $@ $< $(COMMON_SRC) $(PKG_LIBS) -lm -pthread
# fuzz_ctl drives the control server's dispatcher, so it has the daemon's
# modules (all but main.c) and their libraries too.
FUZZ_DAEMON_SRC := $(filter-out daemon/main.c,$(DAEMON_SRC))
$(FUZZ_BUILD)/fuzz_ctl: tests/fuzz/fuzz_ctl.c $(COMMON_SRC) $(FUZZ_DAEMON_SRC)
	@mkdir -p $(dir $@)
	$(if $(Q),@echo "  FUZZ    $<")
	$(Q)$(CLANG) -std=c11 -D_GNU_SOURCE -g -O1 -Icommon -iquote daemon $(PKG_CFLAGS) $(SD_CFLAGS) \
		-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
		-o $@ $< $(COMMON_SRC) $(FUZZ_DAEMON_SRC) $(PKG_LIBS) $(DAEMON_LIBS) -lm -pthread
$(FUZZ_BINS): | depcheck-fuzz
depcheck-fuzz:
	$(Q)PKG_CONFIG='$(PKG_CONFIG)' CC='$(CC)' CLANG='$(CLANG)' scripts/deps --check --fuzz
fuzz-build: $(FUZZ_BINS)
fuzz: fuzz-build
	$(Q)for f in $(FUZZ_BINS); do \
		n=$$(basename $$f); mkdir -p build/fuzz/corpus/$$n; \
		echo "== $$n for $(FUZZ_SECONDS)s"; \
		$$f -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -rss_limit_mb=1024 \
			build/fuzz/corpus/$$n tests/fuzz/seeds/$$n || exit 1; \
	done

bench: all tools $(BENCH_BINS)
	$(Q)ESCTL=$(CURDIR)/$(ESCTL) bench/prepare
	$(Q)ESCTL=$(CURDIR)/$(ESCTL) bench/merge
	$(Q)ESCTL=$(CURDIR)/$(ESCTL) ZCAT=$(CURDIR)/$(BUILD)/bench/zcat bench/compressed
	$(Q)ESCTL=$(CURDIR)/$(ESCTL) CLAIMER=$(CURDIR)/$(BUILD)/bench/claimer bench/claim
	$(Q)ESCTL=$(CURDIR)/$(ESCTL) ESD=$(CURDIR)/$(ESD) TOOLS=$(CURDIR)/$(BUILD)/tools bench/daemon
	$(Q)ESCTL=$(CURDIR)/$(ESCTL) ESD=$(CURDIR)/$(ESD) TOOLS=$(CURDIR)/$(BUILD)/tools bench/fleet
	$(Q)ESCTL=$(CURDIR)/$(ESCTL) ESD=$(CURDIR)/$(ESD) bench/real

# The units get the installed esd's path. esd.yaml is installed only where
# there is none yet, and uninstalled only if it is still the sample.
# No tmpfiles.d snippet: esd.service's RuntimeDirectory=, StateDirectory=
# and ConfigurationDirectory= make its directories (systemd/README.md).
install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SBINDIR) $(DESTDIR)$(MANDIR)/man1 \
		$(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8 $(DESTDIR)$(SYSCONFDIR)/esd \
		$(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(CATALOGDIR) \
		$(DESTDIR)$(BASHCOMPDIR)
	install -m 0755 $(ESCTL) $(DESTDIR)$(BINDIR)/esctl
	install -m 0755 $(ESD) $(DESTDIR)$(SBINDIR)/esd
	install -d $(DESTDIR)$(LIBEXECDIR)/esd
	install -m 0755 $(ESD_DJ) $(DESTDIR)$(LIBEXECDIR)/esd/esd-dj
	install -m 0644 man/esctl.1 $(DESTDIR)$(MANDIR)/man1/esctl.1
	install -m 0644 man/esd.yaml.5 $(DESTDIR)$(MANDIR)/man5/esd.yaml.5
	install -m 0644 man/esd.8 $(DESTDIR)$(MANDIR)/man8/esd.8
	[ -e $(DESTDIR)$(SYSCONFDIR)/esd/esd.yaml ] || \
		install -m 0644 etc/esd.yaml $(DESTDIR)$(SYSCONFDIR)/esd/esd.yaml
	sed -e 's|@SBINDIR@|$(SBINDIR)|g' -e 's|@BINDIR@|$(BINDIR)|g' systemd/esd.service \
		>$(BUILD)/esd.service
	install -m 0644 $(BUILD)/esd.service $(DESTDIR)$(UNITDIR)/esd.service
	install -m 0644 systemd/esd.socket $(DESTDIR)$(UNITDIR)/esd.socket
	install -m 0644 systemd/esd.sysusers $(DESTDIR)$(SYSUSERSDIR)/esd.conf
	install -m 0644 systemd/esd.catalog $(DESTDIR)$(CATALOGDIR)/esd.catalog
	$(ESCTL) completion >$(BUILD)/esctl.bash
	install -m 0644 $(BUILD)/esctl.bash $(DESTDIR)$(BASHCOMPDIR)/esctl

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/esctl $(DESTDIR)$(SBINDIR)/esd \
		$(DESTDIR)$(MANDIR)/man1/esctl.1 $(DESTDIR)$(MANDIR)/man5/esd.yaml.5 \
		$(DESTDIR)$(MANDIR)/man8/esd.8 $(DESTDIR)$(UNITDIR)/esd.service \
		$(DESTDIR)$(UNITDIR)/esd.socket $(DESTDIR)$(SYSUSERSDIR)/esd.conf \
		$(DESTDIR)$(CATALOGDIR)/esd.catalog $(DESTDIR)$(BASHCOMPDIR)/esctl $(DESTDIR)$(LIBEXECDIR)/esd/esd-dj
	rmdir $(DESTDIR)$(LIBEXECDIR)/esd 2>/dev/null || true
	! cmp -s etc/esd.yaml $(DESTDIR)$(SYSCONFDIR)/esd/esd.yaml || \
		rm -f $(DESTDIR)$(SYSCONFDIR)/esd/esd.yaml
	rmdir $(DESTDIR)$(SYSCONFDIR)/esd 2>/dev/null || true


# The layout: .clang-format for the C sources, .editorconfig's basics for
# every tracked text file (scripts/format-check). format rewrites in place.
format:
	$(Q)scripts/format-check --fix
format-check:
	$(Q)scripts/format-check

clean:
	rm -rf build esctl esd

distclean: clean
	rm -rf .venv

-include $(shell find build -name '*.d' 2>/dev/null)
