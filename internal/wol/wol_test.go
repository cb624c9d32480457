package wol

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

var mac = net.HardwareAddr{0x02, 0xca, 0x13, 0x00, 0x00, 0x07}

// The packet is the standard one, byte for byte.
func TestMarshal(t *testing.T) {
	b, err := Encode(mac, nil)
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	want = append(want, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	for range 16 {
		want = append(want, 0x02, 0xca, 0x13, 0x00, 0x00, 0x07)
	}
	if len(b) != 102 || !bytes.Equal(b, want) {
		t.Fatalf("magic packet (%d bytes):\n% x\nwant:\n% x", len(b), b, want)
	}
	for _, pw := range [][]byte{{1, 2, 3, 4}, {1, 2, 3, 4, 5, 6}} {
		b, err := Encode(mac, pw)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != 102+len(pw) || !bytes.Equal(b[:102], want) || !bytes.Equal(b[102:], pw) {
			t.Fatalf("with password % x: % x", pw, b)
		}
		p, err := Parse(b)
		if err != nil || p.MAC.String() != mac.String() || !bytes.Equal(p.Password, pw) {
			t.Fatalf("Parse of a packet with password % x: %+v, %v", pw, p, err)
		}
	}
	for _, c := range []struct {
		mac net.HardwareAddr
		pw  []byte
		msg string
	}{
		{mac[:5], nil, "MAC of 5 bytes"},
		{append(bytes.Clone(mac), 0, 0), nil, "MAC of 8 bytes"},
		{nil, nil, "MAC of 0 bytes"},
		{mac, []byte{1, 2, 3}, "password of 3 bytes"},
		{mac, make([]byte, 8), "password of 8 bytes"},
	} {
		_, err := Encode(c.mac, c.pw)
		if !errors.Is(err, cairn.ErrInvalid) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("Encode(%v, % x): %v; want an invalid error saying %q", c.mac, c.pw, err, c.msg)
		}
	}
}

func TestParse(t *testing.T) {
	good, _ := Encode(mac, nil)
	p, err := Parse(good)
	if err != nil || p.MAC.String() != "02:ca:13:00:00:07" || p.Password != nil {
		t.Fatalf("Parse: %+v, %v", p, err)
	}
	good[6] = 0x99 // the result does not alias the input
	if p.MAC[0] != 0x02 {
		t.Fatal("Parse's MAC shares memory with its input")
	}
	good[6] = 0x02

	badSync := bytes.Clone(good)
	badSync[3] = 0xfe
	badRep := bytes.Clone(good)
	badRep[6+6*9+5] = 0x08 // the 10th repetition ends in 08
	for name, c := range map[string]struct {
		b   []byte
		msg string
	}{
		"empty":          {nil, "magic packet of 0 bytes: want 102"},
		"short":          {good[:101], "magic packet of 101 bytes"},
		"one extra byte": {append(bytes.Clone(good), 0), "magic packet of 103 bytes"},
		"7-byte tail":    {append(bytes.Clone(good), 1, 2, 3, 4, 5, 6, 7), "magic packet of 109 bytes"},
		"bad sync":       {badSync, "sync stream is ff ff ff fe ff ff"},
		"bad repetition": {badRep, "repetition 10 of the MAC is 02:ca:13:00:00:08: the first is 02:ca:13:00:00:07"},
		"all zero":       {make([]byte, 102), "sync stream is 00 00 00 00 00 00"},
	} {
		_, err := Parse(c.b)
		if !errors.Is(err, cairn.ErrInvalid) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: Parse: %v; want an invalid error saying %q", name, err, c.msg)
		}
	}
}

// Send puts exactly one magic packet in one datagram, to the given port or
// to port 9.
func TestSend(t *testing.T) {
	l, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Send(ctx, mac, l.LocalAddr().String()); err != nil {
		t.Fatal(err)
	}
	l.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 2048)
	n, _, err := l.ReadFrom(buf)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Parse(buf[:n])
	if err != nil || p.MAC.String() != mac.String() {
		t.Fatalf("received %d bytes: %+v, %v", n, p, err)
	}

	if err := SendPacket(ctx, Packet{MAC: mac, Password: []byte{1, 2, 3}}, l.LocalAddr().String()); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("SendPacket with a 3-byte password: %v; want invalid", err)
	}
	for _, addr := range []string{"127.0.0.1:99999", "127.0.0.1:discard", ":9", ""} {
		if err := Send(ctx, mac, addr); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("Send to %q: %v; want invalid", addr, err)
		}
	}
	done, cancelDone := context.WithCancel(context.Background())
	cancelDone()
	if err := Send(done, mac, l.LocalAddr().String()); !errors.Is(err, cairn.ErrCanceled) {
		t.Fatalf("Send with a canceled context: %v; want canceled", err)
	}

	// No port: port 9. Only checkable if this process may listen there.
	l9, err := net.ListenPacket("udp4", "127.0.0.1:9")
	if err != nil {
		t.Logf("cannot listen on 127.0.0.1:9 (%v): default port not checked", err)
		return
	}
	defer l9.Close()
	if err := Send(ctx, mac, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	l9.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, _, err := l9.ReadFrom(buf); err != nil || n != Len {
		t.Fatalf("port 9: %d bytes, %v", n, err)
	}
}

// Whatever the input, Parse either refuses it or returns the packet whose
// encoding is exactly the input.
func FuzzParse(f *testing.F) {
	good, _ := Encode(mac, nil)
	f.Add(good)
	pw, _ := Encode(mac, []byte{1, 2, 3, 4, 5, 6})
	f.Add(pw)
	f.Add(good[:50])
	f.Add(bytes.Repeat([]byte{0xff}, 102))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Parse(b)
		if err != nil {
			if !errors.Is(err, cairn.ErrInvalid) {
				t.Fatalf("Parse error of kind %v: %v", cairn.KindOf(err), err)
			}
			return
		}
		again, err := p.Marshal()
		if err != nil {
			t.Fatalf("Marshal of a parsed packet: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("round trip:\n% x\nbecame\n% x", b, again)
		}
	})
}
