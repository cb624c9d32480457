// Package apitypes holds the JSON types that the CLI's --json outputs and
// the web page's API (internal/web, doc/api.md) share, so that the two
// cannot drift apart. A field added here shows in both.
package apitypes

import (
	"time"

	"cairn.dev/cairn/internal/meta"
)

// Version is the version of the web API (doc/api.md): its paths start
// with /api/v1/. A change that removes or renames a field bumps it.
const Version = 1

// Device is one node of the realm: what `cairn devices --json` prints per
// node and /api/v1/devices serves.
type Device struct {
	Name  string     `json:"name"`
	Role  string     `json:"role"`
	State string     `json:"state"`
	Since *time.Time `json:"since,omitempty"` // when it entered state
	// Wake is how the node can be woken; null: no wake method known.
	Wake *meta.WakeInfo `json:"wake"`
	// AlwaysOn: its owner marked it always-on (node serve --always-on,
	// node set-always-on).
	AlwaysOn bool    `json:"always_on,omitempty"`
	Addr     string  `json:"addr,omitempty"`
	Capacity int64   `json:"capacity"`
	Free     int64   `json:"free"`
	Used     int64   `json:"used"`
	Rate     float64 `json:"rate"` // bytes per second
	// Donated is a benefactor's donation (0: none reported); DonorFree
	// what it can still take (its donation less its use, at most its
	// disk's free space; without a donation, its disk's free space).
	Donated    int64      `json:"donated,omitempty"`
	DonorFree  int64      `json:"donor_free,omitempty"`
	Served     int64      `json:"served"`
	Registered time.Time  `json:"registered"`
	LastSeen   *time.Time `json:"last_seen,omitempty"`
	Removed    *time.Time `json:"removed,omitempty"`
	// Metadata is set for a device that serves the realm's metadata.
	Metadata *MetaMember `json:"metadata,omitempty"`
}

// MetaMember is a member of the realm's embedded etcd (cairn devices,
// cairn meta): the device that runs it, its gateway and its health.
type MetaMember struct {
	Node    string `json:"node"`
	Gateway string `json:"gateway,omitempty"`
	// Health: "leader" or "follower" (a voting member the cluster lists
	// as started), "learner" (catching up), "not started" (added, not
	// running yet), "unknown" (the record names it, etcd does not).
	Health string `json:"health"`
}

// Price is a store's list price (a provider's standard class).
type Price struct {
	GBMonth   float64 `json:"gb_month"`   // storing one GB (1e9 bytes) for a month
	Write1000 float64 `json:"write_1000"` // 1,000 PUT or LIST requests
	Read1000  float64 `json:"read_1000"`  // 1,000 GET or HEAD requests
	Source    string  `json:"source"`
}

// StoreInfo is a registered store as this device sees it: what `cairn
// store ls --json` prints per store and /api/v1/stores serves.
type StoreInfo struct {
	meta.StoreRecord
	// Health is "ok" or why the store cannot be used from this device
	// (or was not asked); Latency the round trip of a one-object Has.
	Health  string        `json:"health"`
	Latency time.Duration `json:"latency_ns,omitempty"`
	// Objects and Bytes: what the store holds (a listing), if it said.
	Objects int64 `json:"objects"`
	Bytes   int64 `json:"bytes"`
	// Requests every device made to it so far, by class.
	Requests map[string]int64 `json:"requests"`
	// Price, if the store has a list price, and the estimate: storing
	// Bytes for a month, and the requests so far.
	Price        *Price  `json:"price,omitempty"`
	MonthlyCost  float64 `json:"monthly_storage_cost"`
	RequestsCost float64 `json:"requests_cost"`
}

// MountStatus is what a running mount answers on its status socket
// (doc/format.md, "Mount status socket"): what `cairn status --json`
// prints per mount and /api/v1/work serves.
type MountStatus struct {
	V          int    `json:"v"`
	PID        int    `json:"pid"`
	Mountpoint string `json:"mountpoint"`
	Volume     string `json:"volume"`
	Mode       string `json:"mode"`
	// Closed counts files whose last close(2) left writes that the
	// mount has not queued yet (write-back mode queues at the kernel's
	// release, after the close has returned; counted from the close's
	// FLUSH request).
	Closed int `json:"closed"`
	// Queued counts the commits queued (non-blocking and write-back
	// modes; the one running included) or in progress at a close
	// (blocking mode).
	Queued int `json:"queued"`
	// Namespace counts the namespace and attribute changes not yet
	// written to the metadata (write-back mode's batches).
	Namespace int `json:"namespace"`
	// Pending is Closed + Queued + Namespace.
	Pending int `json:"pending"`
	// CommitsDone and CommitsFailed count the commits this mount
	// finished since it started: made, or given up (a permanent failure;
	// the data is kept in the cache's unsaved/ directory).
	CommitsDone   int64 `json:"commits_done"`
	CommitsFailed int64 `json:"commits_failed"`
	// Offline is set while the metadata service cannot be reached and
	// the mount serves its local copy of the namespace (doc/offline.md).
	Offline *Offline `json:"offline,omitempty"`
	// Error is set, and nothing else, in the reply to a request the
	// mount cannot answer.
	Error string `json:"error,omitempty"`
}

// Offline says since when a device or mount has worked without the
// metadata service, and what it serves meanwhile.
type Offline struct {
	// Since is when the service was found unreachable; Cause is the
	// error that said so.
	Since time.Time `json:"since"`
	Cause string    `json:"cause,omitempty"`
	// Serving is true when a local copy of the namespace answers (a
	// mount's volume whose copy took in a whole listing); CopyRev is the
	// etcd revision it reflects, CopySaved when it was last saved, and
	// CopyEntries how many records it holds.
	Serving     bool      `json:"serving"`
	CopyRev     int64     `json:"copy_revision,omitempty"`
	CopySaved   time.Time `json:"copy_saved,omitzero"`
	CopyEntries int       `json:"copy_entries,omitempty"`
}

// Queue is the state of this device's background upload queue ('cairn
// put --background'): the counts of `cairn queue ls --json`.
type Queue struct {
	Files    int   `json:"files"`
	Bytes    int64 `json:"bytes"`
	Draining bool  `json:"draining"` // a drainer runs now
}

// Work is the work in progress on this device: /api/v1/work.
type Work struct {
	Mounts []MountStatus `json:"mounts"`
	Queue  Queue         `json:"queue"`
}

// Volume is a volume with its use and policies: /api/v1/volumes.
type Volume struct {
	Name         string        `json:"name"`
	Created      time.Time     `json:"created"`
	ChunkAvg     int           `json:"chunk_avg"`
	KeepVersions int           `json:"keep_versions"`
	TrashTTL     time.Duration `json:"trash_ttl_ns"`
	// Files, Dirs and Bytes count what the namespace holds now (the
	// current versions' sizes; the trash not included).
	Files    int64               `json:"files"`
	Dirs     int64               `json:"dirs"`
	Bytes    int64               `json:"bytes"`
	Policies []meta.PolicyRecord `json:"policies"`
}

// FileVersion is a kept version of a file: what `cairn versions --json`
// prints per version and /api/v1/versions serves.
type FileVersion struct {
	N         uint64    `json:"n"`
	Size      int64     `json:"size"`
	Mtime     time.Time `json:"mtime"`
	Committed time.Time `json:"committed"`
	Manifest  string    `json:"manifest"`
	Chunks    int       `json:"chunks"`
	Stores    []string  `json:"stores"`
	Current   bool      `json:"current"`
}

// TrashItem is a removed file or directory that can still be restored:
// what `cairn trash --json` prints per item and /api/v1/trash serves.
type TrashItem struct {
	Path    string    `json:"path"`
	Type    string    `json:"type"`
	Size    int64     `json:"size"`
	Deleted time.Time `json:"deleted"`
	Expires time.Time `json:"expires"`
}

// Status is this device and the realm on one screen: 'cairn status
// --json' and /api/v1/status. Realm is nil when the metadata service
// cannot be reached (Metadata says why); Problems is what needs a
// person's attention, empty when nothing does.
type Status struct {
	Device   string        `json:"device"`
	Role     string        `json:"role"`
	Realm    string        `json:"realm"`
	Metadata MetaHealth    `json:"metadata"`
	Summary  *RealmSummary `json:"summary,omitempty"`
	Pending  Pending       `json:"pending"`
	Problems []Problem     `json:"problems"`
	Mounts   []MountStatus `json:"mounts"`
}

// MetaHealth says whether this device reaches the realm's metadata
// service, and where it lives.
type MetaHealth struct {
	Reachable bool         `json:"reachable"`
	Error     string       `json:"error,omitempty"`
	Members   []MetaMember `json:"members,omitempty"` // empty: the one embedded in this device's realm directory
}

// RealmSummary counts the realm's nodes by power state, and its stores
// and volumes.
type RealmSummary struct {
	Nodes map[string]int `json:"nodes"` // by state: awake, standby, offline (removed ones are not counted)
	// Asleep names the nodes in standby (nothing contacts them until they
	// are woken).
	Asleep  []string `json:"asleep,omitempty"`
	Stores  int      `json:"stores"`
	Volumes int      `json:"volumes"`
}

// Pending is the work this device accepted and has not finished, and the
// realm's offloaded versions that wait for their home.
type Pending struct {
	MountFiles   int   `json:"mount_files"` // the mounts' Pending, summed
	Queue        Queue `json:"queue"`
	Offloads     int   `json:"offloads"` // offload entries that wait for reclaim (cairn offload ls)
	OffloadBytes int64 `json:"offload_bytes"`
}

// Problem is one thing that needs attention: what (a node, a store, a
// mount, "metadata") and why.
type Problem struct {
	What   string `json:"what"`
	Detail string `json:"detail"`
}

// RestoreRequest is the body of POST /api/v1/restore: make version
// Version of the file at Path current again, or (FromTrash) put back the
// most recently removed entry that was at Path, at To if given. Exactly
// one of Version and FromTrash.
type RestoreRequest struct {
	Vol       string `json:"vol"`
	Path      string `json:"path"`
	Version   uint64 `json:"version,omitempty"`
	FromTrash bool   `json:"from_trash,omitempty"`
	To        string `json:"to,omitempty"`
}

// RestoreResult is what a restore did: the path restored, and the new
// current version (a restore of a version makes a new one) or when the
// entry brought back from the trash had been removed.
type RestoreResult struct {
	Path    string     `json:"path"`
	Version uint64     `json:"version,omitempty"`
	Removed *time.Time `json:"removed,omitempty"`
}
