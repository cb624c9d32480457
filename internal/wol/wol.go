// Package wol encodes, parses and sends Wake-on-LAN magic packets.
//
// A magic packet is 6 bytes of 0xFF (the synchronisation stream) followed
// by the 6-byte MAC address of the machine to wake, repeated 16 times:
// 102 bytes. It may end with a SecureOn password of 4 or 6 bytes, which a
// network card that is configured with one checks (106 or 108 bytes in all).
// The packet is sent as the payload of a UDP datagram, by convention to
// port 9 (discard) of the LAN's broadcast address: a sleeping machine has
// no ARP answer for its address, and a packet from another network is not
// forwarded to the LAN's broadcast by routers, which is why issue 17's wake
// proxy sends it from an always-on machine on the same LAN.
//
// Parse is strict: it accepts exactly the packet Marshal makes and nothing
// else (no sync stream found in the middle of a larger payload), so that a
// wake agent acts only on what a real sender sends.
package wol

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

// Port is the UDP port magic packets go to when the address names none
// (the discard port, the common default of senders and of wake agents).
const Port = 9

// Len is the length of a magic packet without a password.
const Len = 6 + 16*6

// Packet is one magic packet: the MAC of the machine to wake and an
// optional SecureOn password (nil, or 4 or 6 bytes).
type Packet struct {
	MAC      net.HardwareAddr
	Password []byte
}

// syncStream is the synchronisation stream that starts every magic packet.
var syncStream = bytes.Repeat([]byte{0xFF}, 6)

// Marshal encodes p. It fails (Kind Invalid) if the MAC is not 6 bytes
// (an EUI-48) or the password is not empty, 4 or 6 bytes.
func (p Packet) Marshal() ([]byte, error) {
	const op = "wol.marshal"
	if len(p.MAC) != 6 {
		return nil, cairn.E(op, cairn.Invalid, p.MAC.String(), fmt.Errorf("MAC of %d bytes: want 6 (an EUI-48)", len(p.MAC)))
	}
	switch len(p.Password) {
	case 0, 4, 6:
	default:
		return nil, cairn.E(op, cairn.Invalid, p.MAC.String(), fmt.Errorf("SecureOn password of %d bytes: want 4 or 6", len(p.Password)))
	}
	b := make([]byte, 0, Len+len(p.Password))
	b = append(b, syncStream...)
	for range 16 {
		b = append(b, p.MAC...)
	}
	return append(b, p.Password...), nil
}

// Encode is Packet{MAC: mac, Password: password}.Marshal().
func Encode(mac net.HardwareAddr, password []byte) ([]byte, error) {
	return Packet{MAC: mac, Password: password}.Marshal()
}

// Parse decodes a magic packet (the payload of the UDP datagram). Every
// error has Kind Invalid and says what is wrong: a length other than 102,
// 106 or 108 bytes, a sync stream that is not 6 bytes of 0xFF, or a MAC
// repetition that differs from the first. The returned Packet does not
// share memory with b.
func Parse(b []byte) (Packet, error) {
	const op = "wol.parse"
	switch len(b) {
	case Len, Len + 4, Len + 6:
	default:
		return Packet{}, cairn.E(op, cairn.Invalid, "", fmt.Errorf("magic packet of %d bytes: want %d, or %d or %d with a SecureOn password", len(b), Len, Len+4, Len+6))
	}
	if !bytes.Equal(b[:6], syncStream) {
		return Packet{}, cairn.E(op, cairn.Invalid, "", fmt.Errorf("sync stream is % x: want ff ff ff ff ff ff", b[:6]))
	}
	mac := net.HardwareAddr(bytes.Clone(b[6:12]))
	for i := 1; i < 16; i++ {
		if rep := b[6+6*i : 12+6*i]; !bytes.Equal(rep, mac) {
			return Packet{}, cairn.E(op, cairn.Invalid, mac.String(), fmt.Errorf("repetition %d of the MAC is %s: the first is %s", i+1, net.HardwareAddr(rep), mac))
		}
	}
	p := Packet{MAC: mac}
	if len(b) > Len {
		p.Password = bytes.Clone(b[Len:])
	}
	return p, nil
}

// Send sends a magic packet for mac (no password) in one UDP datagram to
// addr, "host:port" or "host" (port Port): usually the LAN's broadcast
// address, e.g. "192.168.1.255" or "255.255.255.255". See SendPacket.
func Send(ctx context.Context, mac net.HardwareAddr, addr string) error {
	return SendPacket(ctx, Packet{MAC: mac}, addr)
}

// SendPacket sends p in one UDP datagram over IPv4 to addr ("host:port" or
// "host", port Port), from the network namespace and routes of the calling
// thread. Broadcast addresses are allowed (Go sets SO_BROADCAST on UDP
// sockets). Delivery is not confirmed: UDP has no answer, and neither has a
// sleeping machine; a caller that must know watches the machine come back.
// ctx bounds the whole send; errors carry Kind Invalid (bad packet or
// address), Canceled, or IO.
func SendPacket(ctx context.Context, p Packet, addr string) error {
	const op = "wol.send"
	b, err := p.Marshal()
	if err != nil {
		return cairn.E(op, cairn.Invalid, addr, err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		host, port = addr, strconv.Itoa(Port)
	}
	if n, perr := strconv.ParseUint(port, 10, 16); perr != nil || n == 0 || host == "" {
		return cairn.E(op, cairn.Invalid, addr, errors.New(`want "host:port" or "host" (port 9), a numeric port from 1 to 65535`))
	}
	hostport := net.JoinHostPort(host, port)
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp4", hostport)
	if err != nil {
		if ctx.Err() != nil {
			return cairn.E(op, cairn.Canceled, addr, err)
		}
		return cairn.E(op, cairn.IO, addr, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetWriteDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetWriteDeadline(aLongTimeAgo) })
	defer stop()
	n, err := c.Write(b)
	if err == nil && n != len(b) {
		err = fmt.Errorf("short write: %d of %d bytes", n, len(b))
	}
	if err != nil {
		if ctx.Err() != nil {
			return cairn.E(op, cairn.Canceled, addr, err)
		}
		return cairn.E(op, cairn.IO, addr, err)
	}
	return nil
}

// aLongTimeAgo is a deadline in the past: it makes a blocked write return.
var aLongTimeAgo = time.Unix(1, 0)
