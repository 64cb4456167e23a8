package health

import (
	"testing"
	"time"

	"fulcrum/backend"
	"fulcrum/internal/testkit"
)

// TestSendProxyFront: Redis behind a PROXY-only front (HAProxy's
// accept-proxy) drops a check that sends no header; with send_proxy (v1
// or v2) PING and the role check pass.
func TestSendProxyFront(t *testing.T) {
	r := testkit.StartRedis(t)
	front := testkit.StartProxyFront(t, r.Addr)
	if err := (&Probe{Kind: CheckRedis, Addr: front, Timeout: 2 * time.Second}).Run(t.Context()); err == nil {
		t.Error("no PROXY header to a PROXY-only front: up; want down")
	} else {
		t.Logf("without the header: %v", err)
	}
	for _, v := range []int{1, 2} {
		if err := (&Probe{Kind: CheckRedis, Addr: front, Timeout: 5 * time.Second, SendProxy: v}).Run(t.Context()); err != nil {
			t.Errorf("PING with PROXY v%d: %v; want up", v, err)
		}
		p := &Probe{Kind: CheckRedis, Addr: front, Timeout: 5 * time.Second, SendProxy: v, Role: backend.RolePrimary}
		wantRole(t, "role with PROXY", p, backend.RolePrimary, "")
	}
}

// TestSendProxyMariaDB: MariaDB reads a PROXY header before the login
// only from proxy_protocol_networks; elsewhere the header is a broken
// packet. So the check's header is proven to go first through the
// driver's DialFunc: refused while the network is not listed, up (v1 and
// v2) once it is.
func TestSendProxyMariaDB(t *testing.T) {
	m := testkit.StartMariaDB(t)
	pw := secret(t, testkit.MD5Password)
	mk := func(version int) *Probe {
		return &Probe{Kind: CheckMySQL, Addr: m.Addr, Timeout: 5 * time.Second, User: "checker", PasswordFile: pw, Role: backend.RolePrimary, SendProxy: version}
	}
	if err := mk(2).Run(t.Context()); err == nil {
		t.Error("a PROXY header where MariaDB takes none: up; want down (is the header sent?)")
	} else {
		t.Logf("header not taken: %v", err)
	}
	m.Exec(t, "SET GLOBAL proxy_protocol_networks = '127.0.0.0/8,localhost'")
	for _, v := range []int{1, 2} {
		if err := mk(v).Run(t.Context()); err != nil {
			t.Errorf("PROXY v%d: %v; want up", v, err)
		}
	}
}
