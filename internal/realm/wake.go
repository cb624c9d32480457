package realm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/wol"
)

// burst is how many magic packets one wake sends, burstGap apart: UDP
// has no answer, and a switch or a sleeping card may drop one.
const (
	burst    = 3
	burstGap = 50 * time.Millisecond
)

// sendBurst sends burst magic packets for the MAC of w to its broadcast
// address, from this device.
func sendBurst(ctx context.Context, name string, w *meta.WakeInfo) (int, error) {
	const op = "wake"
	if w == nil || w.MAC == "" {
		return 0, cairn.E(op, cairn.Invalid, name, errors.New("the node has no wake method (see 'cairn node set-wake')"))
	}
	if w.Broadcast == "" {
		return 0, cairn.E(op, cairn.Invalid, name, errors.New("the node's wake method names no broadcast address (see 'cairn node set-wake')"))
	}
	mac, err := net.ParseMAC(w.MAC)
	if err != nil {
		return 0, cairn.E(op, cairn.Invalid, name, err)
	}
	for i := range burst {
		if i > 0 {
			select {
			case <-time.After(burstGap):
			case <-ctx.Done():
				return i, cairn.E(op, cairn.Canceled, name, ctx.Err())
			}
		}
		if err := wol.Send(ctx, mac, w.Broadcast); err != nil {
			return i, err
		}
	}
	return burst, nil
}

// waker is a device node's wake proxy (node.Waker): it wakes a node of the
// realm, by the wake method its record names, for a device that asks.
type waker struct{ m *meta.Service }

func (w waker) Wake(ctx context.Context, peer pki.NodeIdentity, name string) (wire.WakeReply, error) {
	n, err := w.m.Node(ctx, name)
	if err != nil {
		return wire.WakeReply{}, err
	}
	if n.Removed != 0 {
		return wire.WakeReply{}, cairn.E("wake", cairn.NotFound, name, errors.New("the node was removed from the realm"))
	}
	sent, err := sendBurst(ctx, name, n.Wake)
	if err != nil {
		return wire.WakeReply{}, err
	}
	return wire.WakeReply{Node: name, MAC: n.Wake.MAC, Broadcast: n.Wake.Broadcast, Packets: sent}, nil
}

// onLocalLAN reports whether broadcast (an IPv4 address) is the broadcast
// address of a network one of this device's interfaces is on.
func onLocalLAN(broadcast string) bool {
	b, err := netip.ParseAddr(broadcast)
	if err != nil || !b.Is4() {
		return false
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip4 := ipn.IP.To4()
		if ip4 == nil || len(ipn.Mask) != net.IPv4len || ip4.IsLoopback() {
			continue
		}
		var bc [4]byte
		for i := range bc {
			bc[i] = ip4[i] | ^ipn.Mask[i]
		}
		if netip.AddrFrom4(bc) == b {
			return true
		}
	}
	return false
}

// wakeNode wakes node n for a read (director.WakeFunc): through its wake
// proxy if the record names one that is awake (the owner chose it: it is
// on the sleeper's LAN; with none named, an awake always-on device on the
// sleeper's LAN when this device is not, defaultProxy), else by a broadcast from this device when the
// record's broadcast address is on one of its interfaces. A magic packet
// sent from another network never arrives, so there is no other way.
func (r *Realm) wakeNode(ctx context.Context, n meta.NodeStatus) (string, error) {
	const op = "wake"
	w := n.Wake
	if w == nil || w.MAC == "" {
		return "", cairn.E(op, cairn.Invalid, n.Name, errors.New("the node has no wake method (see 'cairn node set-wake')"))
	}
	self := r.nodeName(ctx)
	if w.Proxy == "" && !onLocalLAN(w.Broadcast) {
		// No proxy chosen and not on the sleeper's LAN: an awake
		// always-on device on that LAN is the wake proxy by default.
		if nodes, err := r.Meta.Nodes(ctx); err == nil {
			if p := defaultProxy(nodes, n, self); p != "" {
				wc := *w
				wc.Proxy = p
				w = &wc
			}
		}
	}
	var proxyErr error
	if w.Proxy != "" && w.Proxy != self {
		proxyErr = r.askProxy(ctx, n.Name, w.Proxy)
		if proxyErr == nil {
			return "through wake proxy " + w.Proxy, nil
		}
		r.log.Warn("wake proxy failed", "node", n.Name, "proxy", w.Proxy, "err", proxyErr)
	}
	if w.Proxy == self || onLocalLAN(w.Broadcast) {
		if _, err := sendBurst(ctx, n.Name, w); err != nil {
			return "", err
		}
		return "broadcast to " + w.Broadcast, nil
	}
	if proxyErr != nil {
		return "", cairn.E(op, cairn.Unavailable, n.Name, fmt.Errorf("its wake proxy %s: %w", w.Proxy, proxyErr))
	}
	return "", cairn.E(op, cairn.Unavailable, n.Name, fmt.Errorf("no wake proxy is set and its LAN's broadcast address %q is on no interface of this device (see 'cairn node set-wake --proxy')", w.Broadcast))
}

// askProxy asks node proxy, over the node wire, to wake node name.
func (r *Realm) askProxy(ctx context.Context, name, proxy string) error {
	p, err := r.Meta.Node(ctx, proxy)
	if err != nil {
		return err
	}
	if p.State != meta.NodeOnline || p.Addr == "" {
		return cairn.E("wake", cairn.Unavailable, proxy, fmt.Errorf("the wake proxy is %s", p.State))
	}
	st, err := r.remoteStore(ctx, proxy, p.Addr)
	if err != nil {
		return err
	}
	defer st.Close()
	_, err = st.Wake(ctx, name)
	return err
}

// defaultProxy is the wake proxy of sleeper n when its record names none:
// an awake device marked always-on, other than n and self, whose own wake
// method names n's broadcast address (it is on n's LAN), the first by
// name; "" if there is none.
func defaultProxy(nodes []meta.NodeStatus, n meta.NodeStatus, self string) string {
	if n.Wake == nil || n.Wake.Broadcast == "" {
		return ""
	}
	best := ""
	for _, c := range nodes {
		if c.Name == n.Name || c.Name == self || !c.AlwaysOn || c.Role != string(pki.Device) || c.State != meta.NodeAwake || c.Addr == "" {
			continue
		}
		if c.Wake == nil || c.Wake.Broadcast != n.Wake.Broadcast {
			continue
		}
		if best == "" || c.Name < best {
			best = c.Name
		}
	}
	return best
}
