package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/mount"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/realm"
)

// deviceJSON is what `devices --json` prints per node.
type deviceJSON = apitypes.Device

// devicesOf converts the registry's nodes (shared with 'cairn web').
func devicesOf(nodes []meta.NodeStatus) []deviceJSON {
	out := make([]deviceJSON, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, deviceJSON{Name: n.Name, Role: n.Role, State: n.State, Since: unixTime(n.Since), Wake: n.Wake, AlwaysOn: n.AlwaysOn, Addr: n.Addr, Capacity: n.Capacity, Free: n.Free, Used: n.Used,
			Rate: n.Rate, Donated: n.Donated, DonorFree: n.DonorFree(), Served: n.Served, Registered: time.Unix(0, n.Registered).UTC(), LastSeen: unixTime(n.LastSeen), Removed: unixTime(n.Removed)})
	}
	return out
}

func unixTime(ns int64) *time.Time {
	if ns == 0 {
		return nil
	}
	t := time.Unix(0, ns).UTC()
	return &t
}

func (e *env) devicesCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "devices [--json]",
		Short: "List the realm's nodes: devices, benefactors and surrogates, their power state and how to wake them",
		Long: `List every node of the realm with its role, its state and since when:

  awake    its heartbeat lease is alive (since it registered)
  standby  it announced it was going to sleep ('cairn node standby', or a
           suspend announced through systemd-logind): nobody contacts it
           until it is woken
  offline  its lease lapsed unannounced: stopped, crashed or unreachable
           (since its last report)
  removed  removed by its owner ('cairn node remove')

whether its owner marked it always-on ("device, always-on": see 'cairn node
set-always-on'), how it can be woken (Wake-on-LAN: the MAC and broadcast address of the
interface that carries its address, learned when it registers, and the
proxy that sends the packet, if set; or "no wake method"), its address,
the capacity and use of its store's disk, a benefactor's donation
('node serve --donate') and the space it can still take (FREE: its
donation less its use, at most its disk's free space), its measured
serving rate, and when it last reported; then
where the realm's metadata lives (the devices whose etcd member serves it,
their gateways, and each member's health: leader, follower, learner, not
started).

When the metadata service cannot be reached, the list cannot be read: it
says so, with what each mount of this device serves meanwhile (its local
copy of the namespace: doc/offline.md), and exits 6.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			// A mount of this device that serves its local copy knows the
			// service is gone: ask it for a short while only.
			offline := e.offlineMounts(ctx)
			if len(offline) > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, offlineDevicesTry)
				defer cancel()
			}
			r, err := e.open(ctx)
			var nodes []meta.NodeStatus
			if err == nil {
				nodes, err = r.Meta.Nodes(ctx)
			}
			if err != nil {
				if cairn.KindOf(err) == cairn.Unavailable || ctx.Err() != nil {
					return e.devicesOffline(cmd.Context(), asJSON, err)
				}
				return err
			}
			out := devicesOf(nodes)
			metaMembers := e.metaMembers(cmd.Context(), r, out)
			if asJSON {
				return e.printJSON(out)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tROLE\tSTATE\tSINCE\tADDRESS\tCAPACITY\tUSED\tDONATED\tFREE\tRATE\tLAST SEEN\tWAKE")
			for _, d := range out {
				seen, since := "never", "-"
				if d.LastSeen != nil {
					seen = d.LastSeen.Local().Format(time.DateTime)
				}
				if d.Since != nil {
					since = d.Since.Local().Format(time.DateTime)
				}
				cap, used := "-", "-"
				if d.Capacity > 0 {
					cap, used = apitypes.IBytes(d.Capacity), apitypes.IBytes(d.Used)
				}
				donated, free, rate := "-", "-", "-"
				if d.Donated > 0 {
					donated = apitypes.IBytes(d.Donated)
				}
				if d.Capacity > 0 || d.Donated > 0 {
					free = apitypes.IBytes(d.DonorFree)
				}
				if d.Rate > 0 {
					rate = apitypes.IBytes(int64(d.Rate)) + "/s"
				}
				addr := d.Addr
				if addr == "" {
					addr = "-"
				}
				role := d.Role
				if d.AlwaysOn {
					role += ", always-on"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Name, role, d.State, since, addr, cap, used, donated, free, rate, seen, wakeMethod(d.Wake))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			e.printMetaMembers(metaMembers)
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// wakeMethod says how a node can be woken, for people.
func wakeMethod(w *meta.WakeInfo) string {
	if w == nil || w.MAC == "" {
		return "no wake method"
	}
	s := "wake-on-lan " + w.MAC
	if w.Broadcast != "" {
		s += " to " + w.Broadcast
	}
	if w.Proxy != "" {
		s += " by " + w.Proxy
	}
	return s
}

func (e *env) nodeCmd() *cobra.Command {
	c := &cobra.Command{Use: "node", Short: "Run this machine's node, or remove a node from the realm"}
	var listen, advertise, gatewayListen, donate string
	var noGateway, alwaysOn bool
	var registrars []string
	var lease, drain, maintEvery, reclaimEvery time.Duration
	var sleepBus, metricsAddr string
	var offer, quota string
	var stagingLease time.Duration
	serve := &cobra.Command{
		Use:   "serve [--listen HOST:PORT] [--gateway-listen HOST:PORT] [--registrar ADDR] [--donate SIZE]",
		Short: "Serve this machine's store to the realm's devices (and, on a device, the join and registrar endpoints)",
		Long: `Serve this machine's local store to the realm's devices over HTTP/2 with mutual
TLS 1.3 (realm certificates only). The node registers in the realm's registry
with a lease (its heartbeat: if it stops, it shows offline once the lease
lapses) and reports its capacity, free space, use and serving rate. SIGINT or
SIGTERM deregisters it and exits 0; a node removed from the realm stops with
exit code 4.

On a device the node also serves, on the device holding the realm CA, the join
endpoint that 'cairn invite' tokens point to, and on every device the
registrar of benefactors and surrogates. The device that runs the realm's
embedded etcd also serves it to the other devices, over mutual TLS with
their node certificates (the metadata gateway: only devices get in), on
--gateway-listen (default: the --listen host and port + 1, so that port
must be free too; --no-gateway serves none); a device that joins gets
the gateways of the online devices, so run 'node serve' here before 'cairn
invite', and keep it running while other devices use the realm.

On a benefactor or surrogate (a home made by 'cairn join' with such a token:
credentials only, no keys, no metadata access) it serves the store in
$CAIRN_HOME/store and reports every lease/3 to a registrar, a device's node,
which records it in the registry: at first the device that admitted it (the
join address), then any online device the registrars name. --registrar
ADDR[,ADDR] reports to those instead. It learns the realm's revocation list
from its registrar, and refuses every request until it has one. A
benefactor refuses writes past --donate SIZE (its donation; default: no
bound but its disk); a surrogate refuses every write (it holds staged
copies only).

A surrogate also serves the staging API of data staging on the same
listener (doc/surrogate.md): the realm's devices register (each gets a
quota, a session key and a lease), stage encrypted chunks named by hash,
read them back, and unstage them. --offer SIZE is the space offered to all
of them together (default: half the free space of CAIRN_HOME's file system
at start), --quota SIZE the most one device's session is granted (default:
a quarter of the offer), --staging-lease DURATION how long a registration
lasts unless renewed (default 1h). It keeps soft state only, in
$CAIRN_HOME/staged: deleted at every start, and a session's chunks when its
lease ends or it deregisters.

Every node has power states (see 'cairn devices'), a device's as a
benefactor's or surrogate's: 'cairn node standby' announces by hand that
this machine is going to sleep, 'cairn node resume' that it is awake again
(a benefactor or surrogate has its standby recorded by its registrar). On Linux the node also takes systemd-logind's
delay inhibitor of sleep (on the system bus, or --sleep-bus ADDRESS): a
suspend then announces itself the same way before the machine sleeps, and
the node is awake again when it resumes. Without logind (a container, a
machine without systemd) it says so once in its log and serves all the
same: a sleep then reads as offline until the node reports again.
Background work: while a device's node is awake and idle (no chunk
request in flight or served since its last look), it looks about once an
hour (at a random moment, so that the realm's devices do not all look at
once) for stores whose last gc or repair is older than --maint-every
(default 24h; their last scrub, 7 times that) and runs it then, over the
stores that are awake ('cairn gc', 'cairn repair [--scrub]'): a store whose
node slept is skipped, never woken, and caught up at a later look once it
is awake. --maint-every 0 turns it off.
--always-on marks this device always-on in the realm's registry (a home
server, a NAS: see 'cairn node set-always-on'); the mark stays until
'cairn node set-always-on NAME --off'.

It prints "serving NAME on ADDRESS" once ready. --metrics ADDR also serves
Prometheus metrics on http://ADDR/metrics (doc/metrics.md).`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := e.serveMetrics(cmd.Context(), metricsAddr); err != nil {
				return err
			}
			if c, err := pki.LoadCredentials(realm.CredentialsDir(e.home)); err == nil && c.Identity.Role != pki.Device {
				var donation int64
				if alwaysOn {
					return withCode(ExitUsage, fmt.Errorf("node serve: --always-on is for a device; mark a %s from a device with 'cairn node set-always-on %s'", c.Identity.Role, c.Identity.Name))
				}
				var staging realm.StagingOptions
				if offer != "" || quota != "" || cmd.Flags().Changed("staging-lease") {
					if c.Identity.Role != pki.Surrogate {
						return withCode(ExitUsage, fmt.Errorf("node serve: --offer, --quota and --staging-lease are for a surrogate, not a %s", c.Identity.Role))
					}
					for _, f := range []struct {
						flag, v string
						n       *int64
					}{{"--offer", offer, &staging.Offer}, {"--quota", quota, &staging.Quota}} {
						if f.v == "" {
							continue
						}
						n, perr := parseSize(f.v)
						if perr != nil || n <= 0 {
							return withCode(ExitUsage, fmt.Errorf("node serve: %s %q: want a size above 0 (e.g. 50GiB)", f.flag, f.v))
						}
						*f.n = n
					}
					if stagingLease < time.Minute {
						return withCode(ExitUsage, fmt.Errorf("node serve: --staging-lease %v: want at least 1m", stagingLease))
					}
					staging.Lease = stagingLease
				}
				if donate != "" {
					if c.Identity.Role != pki.Benefactor {
						return withCode(ExitUsage, fmt.Errorf("node serve: --donate is for a benefactor; a %s takes no writes", c.Identity.Role))
					}
					n, perr := parseSize(donate)
					if perr != nil {
						return withCode(ExitUsage, fmt.Errorf("node serve: --donate: %w", perr))
					}
					donation = n
				}
				return e.serveStandalone(cmd, c, realm.StandaloneOptions{Listen: listen, Advertise: advertise, Lease: lease, Registrars: registrars, Donation: donation,
					DrainTimeout: drain, SleepBus: sleepBus, Staging: staging})
			}
			if offer != "" || quota != "" || cmd.Flags().Changed("staging-lease") {
				return withCode(ExitUsage, errors.New("node serve: --offer, --quota and --staging-lease are for a surrogate; a device stages on surrogates, it is none"))
			}
			if donate != "" {
				return withCode(ExitUsage, errors.New("node serve: --donate is for a benefactor; a device's store is its own"))
			}
			if len(registrars) > 0 {
				return withCode(ExitUsage, errors.New("node serve: --registrar is for a benefactor or surrogate; a device registers in the metadata itself"))
			}
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			creds, err := r.Credentials(cmd.Context())
			if err != nil {
				return err
			}
			go e.drainWhileServing(cmd.Context())
			defer e.keepPins(cmd.Context())() // this device's pins (doc/offline.md, "Pins")
			err = r.Serve(cmd.Context(), realm.ServeOptions{Listen: listen, Advertise: advertise, Lease: lease, GatewayListen: gatewayListen, NoGateway: noGateway,
				DrainTimeout: drain, SleepBus: sleepBus, AlwaysOn: alwaysOn, Maint: realm.MaintOptions{Every: maintEvery}, ReclaimEvery: reclaimEvery, Ready: func(addr string, join bool) {
					extra := ""
					if join {
						extra = " (and the join endpoint)"
					}
					if st, nerr := r.Meta.Node(cmd.Context(), creds.Identity.Name); nerr == nil && st.Gateway != "" {
						extra += ", metadata gateway on " + st.Gateway
					}
					fmt.Fprintf(e.stdout, "serving %s on %s%s\n", creds.Identity.Name, addr, extra)
				}})
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "stopped %s\n", creds.Identity.Name)
			return nil
		},
	}
	serve.Flags().StringVar(&listen, "listen", ":7461", "address of the chunk service (port 0 picks one); the metadata gateway takes port + 1 unless --gateway-listen says otherwise")
	serve.Flags().StringVar(&advertise, "advertise", "", "address other nodes dial (default: the listening address, the host name for an unspecified host)")
	serve.Flags().DurationVar(&lease, "lease", realm.DefaultLease, "heartbeat lease: a node that stops shows offline after this long")
	serve.Flags().StringVar(&gatewayListen, "gateway-listen", "", "device running the embedded etcd: where the metadata gateway listens (default: the --listen host, port + 1)")
	serve.Flags().BoolVar(&noGateway, "no-gateway", false, "do not serve the metadata gateway (no other device can then reach this realm's metadata)")
	serve.Flags().StringVar(&donate, "donate", "", "benefactor: the most its store may hold (e.g. 50GiB); puts past it are refused")
	serve.Flags().StringVar(&offer, "offer", "", "surrogate: the space offered to the realm's devices for staging, all together (e.g. 50GiB; default: half the free space at start)")
	serve.Flags().StringVar(&quota, "quota", "", "surrogate: the most one device's staging session is granted (default: a quarter of --offer)")
	serve.Flags().DurationVar(&stagingLease, "staging-lease", time.Hour, "surrogate: how long a device's staging registration lasts unless renewed; its chunks are deleted when it ends")
	serve.Flags().DurationVar(&reclaimEvery, "reclaim-every", realm.DefaultReclaimEvery, "device: how often to move home what was offloaded while it slept (also done at start and on resume; negative: only 'cairn offload reclaim')")
	serve.Flags().DurationVar(&drain, "drain", realm.DefaultDrainTimeout, "how long a node announcing standby waits for the chunk requests in flight")
	serve.Flags().StringVar(&sleepBus, "sleep-bus", os.Getenv("CAIRN_SLEEP_BUS"), "D-Bus address where systemd-logind is (default: $CAIRN_SLEEP_BUS, else the system bus; \"none\": do not take its sleep inhibitor)")
	serve.Flags().DurationVar(&maintEvery, "maint-every", realm.DefaultMaintEvery, "device: run gc and repair of the realm's awake stores when one was last done longer ago than this (scrub: 7 times that), while this node is awake and idle; 0: never")
	serve.Flags().BoolVar(&alwaysOn, "always-on", false, "device: mark this device always-on in the registry (it takes the metadata service first, and wakes its LAN's sleepers)")
	metricsFlag(serve, &metricsAddr)
	serve.Flags().StringSliceVar(&registrars, "registrar", nil, "benefactor or surrogate: the registrars (devices' node addresses HOST:PORT) to report to, instead of those it knows")
	remove := &cobra.Command{
		Use:   "remove NAME",
		Short: "Remove a node from the realm: its certificates are refused everywhere",
		Long: `Remove a node: the certificates the realm issued to it are revoked in the
realm's revocation list (kept in the metadata service, so every running node
refuses them within moments, also on connections already open), and the
registry marks it removed. The machine can join again only with a new
invitation.`,
		Args: exactArgs(1, "a node name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := pki.ValidName(name); err != nil {
				return err
			}
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			if c, err := r.Credentials(cmd.Context()); err == nil && c.Identity.Name == name {
				return cairn.E("node remove", cairn.Invalid, name, errors.New("this is the device you are on: remove it from another device"))
			}
			if err := r.Meta.RemoveNode(cmd.Context(), name, time.Time{}); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "removed %s: its certificates are revoked\n", name)
			return nil
		},
	}
	c.AddCommand(serve, remove, e.powerCmd("standby"), e.powerCmd("resume"), e.setWakeCmd(), e.setAlwaysOnCmd())
	return c
}

// setWakeCmd makes `node set-wake`: the owner's wake method for a node.
func (e *env) setWakeCmd() *cobra.Command {
	var mac, bcast, proxy string
	var learn bool
	c := &cobra.Command{
		Use:   "set-wake NAME (--mac MAC [--broadcast IP] [--proxy NODE] | --learn)",
		Short: "Set how a node can be woken (Wake-on-LAN), instead of what it learns",
		Long: `Set how node NAME can be woken while it sleeps: the MAC address its
Wake-on-LAN magic packet names, the IPv4 broadcast address it is sent to,
and the node that sends it (--proxy: an awake node on its LAN). A node
learns its own at each registration (the interface that carries its
address); a method set here is kept instead, until --learn forgets it and
the node's next registration records what it learns. 'cairn devices' shows
it.`,
		Args: exactArgs(1, "a node name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			const op = "node set-wake"
			name := args[0]
			if err := pki.ValidName(name); err != nil {
				return err
			}
			var w *meta.WakeInfo
			switch {
			case learn && (mac != "" || bcast != "" || proxy != ""):
				return withCode(ExitUsage, errors.New("node set-wake: --learn takes no --mac, --broadcast or --proxy"))
			case !learn && mac == "":
				return withCode(ExitUsage, errors.New("node set-wake: give --mac (and --broadcast, --proxy), or --learn"))
			case !learn:
				hw, err := net.ParseMAC(mac)
				if err != nil || len(hw) != 6 {
					return cairn.E(op, cairn.Invalid, name, fmt.Errorf("--mac %q: not a 48-bit MAC address", mac))
				}
				w = &meta.WakeInfo{MAC: hw.String(), Proxy: proxy}
				if bcast != "" {
					ip := net.ParseIP(bcast)
					if ip == nil || ip.To4() == nil {
						return cairn.E(op, cairn.Invalid, name, fmt.Errorf("--broadcast %q: not an IPv4 address", bcast))
					}
					w.Broadcast = ip.To4().String()
				}
				if proxy != "" {
					if err := pki.ValidName(proxy); err != nil {
						return err
					}
				}
			}
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			if err := r.Meta.SetNodeWake(cmd.Context(), name, w); err != nil {
				return err
			}
			if w == nil {
				fmt.Fprintf(e.stdout, "%s: its next registration records the wake method it learns\n", name)
				return nil
			}
			fmt.Fprintf(e.stdout, "%s: %s\n", name, wakeMethod(w))
			return nil
		},
	}
	c.Flags().StringVar(&mac, "mac", "", "the MAC address of the node's interface (aa:bb:cc:dd:ee:ff)")
	c.Flags().StringVar(&bcast, "broadcast", "", "the IPv4 broadcast address the magic packet is sent to")
	c.Flags().StringVar(&proxy, "proxy", "", "the node that sends the magic packet (awake on the same LAN)")
	c.Flags().BoolVar(&learn, "learn", false, "forget the method set by hand: the node's next registration records what it learns")
	return c
}

// setAlwaysOnCmd makes `node set-always-on`: the owner's mark of a node
// that is kept running.
func (e *env) setAlwaysOnCmd() *cobra.Command {
	var off bool
	c := &cobra.Command{
		Use:   "set-always-on NAME [--off]",
		Short: "Mark a node always-on (a machine you keep running), or not (--off)",
		Long: `Mark node NAME always-on in the realm's registry: a machine its owner keeps
running, such as a home server or a NAS. 'cairn devices' shows it. An
always-on device takes the realm's metadata service first when the device
hosting it goes to standby (before the other awake devices), and it is the
wake proxy of the nodes on its LAN that name none ('cairn node set-wake
--proxy' chooses another). A node marked always-on that announces standby
warns that the realm counts on it. --off removes the mark ('node serve
--always-on' sets it again at its next start). Any node can be marked,
benefactors and surrogates included.`,
		Args: exactArgs(1, "a node name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := pki.ValidName(name); err != nil {
				return err
			}
			r, err := e.open(cmd.Context())
			if err != nil {
				return err
			}
			if err := r.Meta.SetNodeAlwaysOn(cmd.Context(), name, !off); err != nil {
				return err
			}
			if off {
				fmt.Fprintf(e.stdout, "%s is not marked always-on\n", name)
				return nil
			}
			fmt.Fprintf(e.stdout, "%s is marked always-on\n", name)
			return nil
		},
	}
	c.Flags().BoolVar(&off, "off", false, "remove the mark")
	return c
}

// powerCmd makes `node standby` and `node resume`: requests to the node
// running in this home, through its control socket.
func (e *env) powerCmd(op string) *cobra.Command {
	c := &cobra.Command{
		Use:   op,
		Short: "Announce that this machine is going to sleep: the running node finishes its transfers and records standby",
		Long: `Announce by hand that this machine is going to sleep. The running node
('cairn node serve' in this $CAIRN_HOME: a device, a benefactor or a
surrogate) stops taking chunk requests, waits for those in flight (at most
its --drain), on a device hands the benefactors and surrogates it
registers to other devices, records in the realm that it is in standby,
since when and how it can be woken (Wake-on-LAN: the MAC and broadcast
address of the interface that carries its address), and ends its heartbeat
lease cleanly, so that the other devices read it as asleep, not offline,
and leave it alone (a benefactor or surrogate asks its registrar, a
device, to record this). A device that hosts the realm's metadata service hands
it to an awake device first (as 'cairn meta move' does); if none can take
it, the standby warns that the metadata service sleeps with this device.
It keeps running: 'cairn node resume' (or a suspend and
resume of the machine, which the node notices) makes it awake again.

On Linux with systemd the node announces a real suspend by itself (see
'cairn node serve').`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
			defer cancel()
			rep, err := realm.Control(ctx, e.home, op)
			if err != nil {
				return err
			}
			since := time.Unix(0, rep.Since).Local().Format(time.DateTime)
			if op == "resume" {
				fmt.Fprintf(e.stdout, "%s is awake (since %s)\n", rep.Node, since)
				return nil
			}
			for _, h := range rep.Primaries {
				if h.To != "" {
					fmt.Fprintf(e.stdout, "handed the primary of %s to %s\n", h.Policy, h.To)
				} else {
					fmt.Fprintf(e.stderr, "warning: %s stays the primary of %s (%s): reads of it go to its other replicas' stores as they answer\n", rep.Node, h.Policy, h.Kept)
				}
			}
			if rep.PrimariesError != "" {
				fmt.Fprintf(e.stderr, "warning: the primary roles of %s were not handed over: %s\n", rep.Node, rep.PrimariesError)
			}
			if rep.MetaMovedTo != "" {
				fmt.Fprintf(e.stdout, "handed the metadata service to %s\n", rep.MetaMovedTo)
			}
			fmt.Fprintf(e.stdout, "%s is in standby since %s; %s\n", rep.Node, since, wakeMethod(rep.Wake))
			if rep.AlwaysOn {
				fmt.Fprintf(e.stderr, "warning: %s is marked always-on: the realm counts on it being awake (its LAN's wake proxy, the metadata service's first choice); 'cairn node set-always-on %s --off' if it sleeps from now on\n", rep.Node, rep.Node)
			}
			if rep.MetaSleeps != "" {
				fmt.Fprintf(e.stderr, "warning: the realm's metadata service sleeps with %s (%s): the other devices cannot reach it until it is awake\n", rep.Node, rep.MetaSleeps)
			}
			if rep.Unfinished > 0 {
				fmt.Fprintf(e.stderr, "warning: %d chunk requests were still in flight after the drain bound\n", rep.Unfinished)
			}
			return nil
		},
	}
	if op == "resume" {
		c.Short = "Announce that this machine is awake again: the running node registers again, awake"
		c.Long = `Announce by hand that this machine is awake again after 'cairn node standby':
the running node takes chunk requests again and registers in the realm,
awake. Nothing happens if it is awake already.`
	}
	return c
}

// serveStandalone runs the node of a benefactor's or surrogate's home.
func (e *env) serveStandalone(cmd *cobra.Command, c *pki.Credentials, o realm.StandaloneOptions) error {
	name := c.Identity.Name
	o.Logger = e.log
	o.Ready = func(addr, registrar string) {
		via := "registered through " + registrar
		if registrar == "" {
			via = "no registrar reached yet: retrying"
		}
		fmt.Fprintf(e.stdout, "serving %s on %s (%s; %s)\n", name, addr, c.Identity.Role, via)
	}
	if err := realm.ServeStandalone(cmd.Context(), e.home, o); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "stopped %s\n", name)
	return nil
}

// offlineDevicesTry bounds the attempt of 'cairn devices' to reach the metadata
// service when a mount of this device already finds it unreachable.
const offlineDevicesTry = 3 * time.Second

// offlineMounts returns this device's running mounts that are offline.
func (e *env) offlineMounts(ctx context.Context) []mount.Status {
	all, _ := e.mountStatus(ctx, false)
	var out []mount.Status
	for _, s := range all {
		if s.Offline != nil {
			out = append(out, s)
		}
	}
	return out
}

// DevicesOffline is what 'cairn devices --json' prints when the metadata
// service cannot be reached: the registry is not readable, and this
// device's mounts that serve their local copies (doc/offline.md).
type DevicesOffline struct {
	Offline bool           `json:"offline"`
	Error   string         `json:"error"`
	Mounts  []mount.Status `json:"mounts"`
}

// devicesOffline says that the registry cannot be read because the
// metadata service cannot be reached, and what this device serves
// meanwhile; it returns err (exit 6).
func (e *env) devicesOffline(ctx context.Context, asJSON bool, err error) error {
	mounts := e.offlineMounts(ctx)
	if cairn.KindOf(err) != cairn.Unavailable {
		err = cairn.E("devices", cairn.Unavailable, "", fmt.Errorf("the metadata service did not answer in %v: %w", offlineDevicesTry, err))
	}
	if asJSON {
		if mounts == nil {
			mounts = []mount.Status{}
		}
		if perr := e.printJSON(DevicesOffline{Offline: true, Error: err.Error(), Mounts: mounts}); perr != nil {
			return perr
		}
		return err
	}
	fmt.Fprintln(e.stdout, "offline: the metadata service cannot be reached; the device list is not available")
	for _, s := range mounts {
		fmt.Fprintln(e.stdout, offlineLine(s.Mountpoint, s.Offline))
	}
	return err
}
