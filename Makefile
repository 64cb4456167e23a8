# fulcrum: build, install and package.
#
#   make                  ./fulcrum (version stamped from git describe) and the man pages
#   make install          into $(DESTDIR)$(PREFIX): binary, units, man pages, completion,
#                         the opt-in drop-in share/fulcrum/transparent.conf (not enabled),
#                         and /etc/fulcrum/fulcrum.toml unless one exists
#   make deb              build/fulcrum_VERSION_ARCH.deb (packaging/deb/build.sh)
#   make test             the full suite;  make test-short: the quick one
#
# Variables: PREFIX (/usr/local), DESTDIR, BINDIR, MANDIR, UNITDIR, SYSCONFDIR
# (/etc, where the binary looks by default), BASHCOMPDIR, ZSHCOMPDIR, VERSION.

PREFIX      ?= /usr/local
DESTDIR     ?=
BINDIR      ?= $(PREFIX)/bin
MANDIR      ?= $(PREFIX)/share/man
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR  ?= /etc
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR  ?= $(PREFIX)/share/zsh/site-functions

GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
# The build date: SOURCE_DATE_EPOCH when set (reproducible builds), else now.
DATE    ?= $(shell date -u -d "@$${SOURCE_DATE_EPOCH:-$$(date +%s)}" +%Y-%m-%dT%H:%M:%SZ)
LDFLAGS ?= -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.date=$(DATE)
GOBUILD  = CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false

INSTALL ?= install

.PHONY: all fulcrum man install uninstall deb test test-short clean

all: fulcrum man

# Always rebuilt: go build knows what changed, make does not.
fulcrum:
	$(GOBUILD) -ldflags "$(LDFLAGS)" -o fulcrum .

# Always rebuilt too: the pages carry the version, and take a moment.
man:
	docs/man/build.sh build/man $(VERSION)

install: all
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(MANDIR)/man8 $(DESTDIR)$(MANDIR)/man5 \
		$(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(SYSCONFDIR)/fulcrum $(DESTDIR)$(PREFIX)/share/fulcrum
	$(INSTALL) -m 0755 fulcrum $(DESTDIR)$(BINDIR)/fulcrum
	sed -e 's|/usr/local/bin/fulcrum|$(BINDIR)/fulcrum|g' -e 's|/etc/fulcrum/|$(SYSCONFDIR)/fulcrum/|g' \
		systemd/fulcrum.service >$(DESTDIR)$(UNITDIR)/fulcrum.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/fulcrum.service
	$(INSTALL) -m 0644 systemd/fulcrum.socket $(DESTDIR)$(UNITDIR)/fulcrum.socket
	@# source = "client"'s capability: shipped, enabled only by the operator (docs/databases.md).
	$(INSTALL) -m 0644 systemd/transparent.conf $(DESTDIR)$(PREFIX)/share/fulcrum/transparent.conf
	$(INSTALL) -m 0644 build/man/fulcrum.8 $(DESTDIR)$(MANDIR)/man8/fulcrum.8
	$(INSTALL) -m 0644 build/man/fulcrum.toml.5 $(DESTDIR)$(MANDIR)/man5/fulcrum.toml.5
	$(INSTALL) -m 0644 completion/fulcrum.bash $(DESTDIR)$(BASHCOMPDIR)/fulcrum
	$(INSTALL) -m 0644 completion/_fulcrum $(DESTDIR)$(ZSHCOMPDIR)/_fulcrum
	@# An operator's configuration is never overwritten.
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/fulcrum/fulcrum.toml ]; then \
		echo "keeping $(DESTDIR)$(SYSCONFDIR)/fulcrum/fulcrum.toml (the example is systemd/fulcrum.toml)"; \
	else \
		echo "$(INSTALL) -m 0644 systemd/fulcrum.toml $(DESTDIR)$(SYSCONFDIR)/fulcrum/fulcrum.toml"; \
		$(INSTALL) -m 0644 systemd/fulcrum.toml $(DESTDIR)$(SYSCONFDIR)/fulcrum/fulcrum.toml; \
	fi
	@echo "installed; now: systemctl daemon-reload && systemctl enable --now fulcrum"

# The configuration stays, as a package's conffile does until a purge.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/fulcrum $(DESTDIR)$(UNITDIR)/fulcrum.service $(DESTDIR)$(UNITDIR)/fulcrum.socket \
		$(DESTDIR)$(PREFIX)/share/fulcrum/transparent.conf \
		$(DESTDIR)$(MANDIR)/man8/fulcrum.8 $(DESTDIR)$(MANDIR)/man5/fulcrum.toml.5 \
		$(DESTDIR)$(BASHCOMPDIR)/fulcrum $(DESTDIR)$(ZSHCOMPDIR)/_fulcrum

deb:
	VERSION=$(VERSION) COMMIT=$(COMMIT) DATE=$(DATE) packaging/deb/build.sh build

test:
	$(GO) test -race -count=1 ./...

test-short:
	$(GO) test -short -count=1 ./...

clean:
	rm -rf fulcrum build
