package realm

import (
	"slices"
	"testing"

	"cairn.dev/cairn/internal/meta"
)

func ns(name, role, state string, alwaysOn bool, bcast string) meta.NodeStatus {
	st := meta.NodeStatus{NodeRecord: meta.NodeRecord{Name: name, Role: role, Addr: name + ":1", AlwaysOn: alwaysOn}, State: state}
	if bcast != "" {
		st.Wake = &meta.WakeInfo{MAC: "02:00:00:00:00:01", Broadcast: bcast}
	}
	return st
}

// The metadata service goes to an awake always-on device first, then to
// the other awake devices, each group by name; never to self, a node in
// standby or offline, or a benefactor.
func TestPowerMetaHeirsAlwaysOnFirst(t *testing.T) {
	nodes := []meta.NodeStatus{
		ns("alpha", "device", meta.NodeAwake, false, ""),
		ns("zeta", "device", meta.NodeAwake, true, ""),
		ns("nas", "device", meta.NodeAwake, true, ""),
		ns("self", "device", meta.NodeAwake, true, ""),
		ns("sleepy", "device", meta.NodeStandby, true, ""),
		ns("gone", "device", meta.NodeOffline, true, ""),
		ns("donor", "benefactor", meta.NodeAwake, true, ""),
		ns("beta", "device", meta.NodeAwake, false, ""),
	}
	if got, want := metaHeirs(nodes, "self"), []string{"nas", "zeta", "alpha", "beta"}; !slices.Equal(got, want) {
		t.Fatalf("heirs %v, want %v", got, want)
	}
}

// A sleeper whose record names no wake proxy is woken by an awake
// always-on device on its LAN (same broadcast address), the first by
// name; none if no such device is awake.
func TestPowerDefaultWakeProxy(t *testing.T) {
	sleeper := ns("lap", "device", meta.NodeStandby, false, "192.0.2.255")
	nodes := []meta.NodeStatus{
		sleeper,
		ns("other-lan", "device", meta.NodeAwake, true, "198.51.100.255"),
		ns("not-marked", "device", meta.NodeAwake, false, "192.0.2.255"),
		ns("nas2", "device", meta.NodeAwake, true, "192.0.2.255"),
		ns("nas1", "device", meta.NodeAwake, true, "192.0.2.255"),
		ns("asleep", "device", meta.NodeStandby, true, "192.0.2.255"),
		ns("me", "device", meta.NodeAwake, true, "192.0.2.255"),
	}
	if p := defaultProxy(nodes, sleeper, "me"); p != "nas1" {
		t.Fatalf("default proxy %q, want nas1", p)
	}
	if p := defaultProxy(nodes[:4:4][:3], sleeper, "me"); p != "" {
		t.Fatalf("default proxy with no always-on device on the LAN: %q", p)
	}
	if p := defaultProxy(nodes, ns("nowake", "device", meta.NodeStandby, false, ""), "me"); p != "" {
		t.Fatalf("default proxy of a node with no broadcast address: %q", p)
	}
}
