// Package faults holds the faults a simulated cluster injects on demand, per
// node. They are read from a YAML (or JSON) file that is re-read whenever it
// changes, so a test can switch a fault on or off while the cluster runs:
//
//	nodes:
//	  cp-2:
//	    applyBlocks: true            # a non-dry-run ApplyConfiguration blocks until the caller gives up
//	    neverReady: [kube-scheduler] # these components never get Ready once started on a new spec
//	    stayNotReady: true           # the node stays NotReady after its kubelet restarts or it reboots
//	    restartsContainers: true     # its kubelet, started on a new version, restarts every container of its pods (see below)
//	    pullFails: true              # image pulls fail
//	    unreachableAfterApply: 20s   # the Talos API refuses connections this long after each apply
//	    unreachable: true            # the Talos API refuses connections while this is set
//	    abFallback: true             # a Talos upgrade boots back into the old version
//	    neverBoots: true             # a Talos upgrade reboots and never comes back
//	    upgradeUnavailable: true     # the Upgrade call does its work, then answers Unavailable (see below)
//	    installHangs: true           # the install ends, then the upgrade stalls before its reboot (see below)
//	    installTakes: 20s            # an install (LifecycleService.Upgrade) runs this long on the node, whether its caller waits or not
//	    logSlow: 30s                 # reading machined's log (MachineService.Logs) answers only after this long
//	    etcdStopped: true            # its etcd member is stopped but still listed: its etcd calls wait for the caller's deadline
//	    etcdAlarm: NOSPACE           # its etcd member raised this alarm (NOSPACE or CORRUPT)
//	    etcdStalled: true            # its etcd member answers, but its raft indexes stop where they are while the others move on
//	    etcdStatusLatency: 2s        # its etcd status call answers this late (a loaded node: Talos dials etcd anew for each call)
//	    poweredOff: true             # the machine is off: from `up` it boots (and joins) once cleared; set later, it loses power
//	    terminationTakes: 5s         # a pod deleted on it (evicted) stops this long after, at most its grace period (see below)
//	apiServerDown: true              # the cluster's kube-apiserver is stopped while set and started again once cleared (a restart)
//	unpublished:                     # references no registry serves any more, for every node (see below)
//	  - factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.1
//	  - registry.k8s.io/kube-proxy   # a repository without a tag: every tag of it
//
// The two upgrade faults mean what the call the node's Talos has would show.
// From Talos 1.13 the upgrade is LifecycleService.Upgrade, which installs
// while the caller waits and leaves the reboot to a Reboot call:
// upgradeUnavailable installs, then answers Unavailable (the stream reset)
// and nothing reboots; installHangs installs, then the stream sends nothing
// until the caller gives up. Before 1.13 only MachineService.Upgrade exists:
// the call checks, answers an ack at once and the node drains, installs and
// reboots by itself in the background, so upgradeUnavailable starts that
// sequence and answers Unavailable instead of the ack (the answer lost; the
// node, still up when the caller hears it, installs and reboots by itself),
// and installHangs holds the sequence after its install, before its reboot,
// while the fault is set (the node up, cordoned, installed, in the same
// boot; the caller had its ack long before), as a sequence stuck in its
// last phases would.
//
// restartsContainers is a kubelet whose container hash changed with its
// version, as v1.31's did (kubernetes/kubernetes#129385): the new kubelet
// sees every running container's definition as changed, kills it (SIGTERM,
// the pod's grace) and starts it again in the same pod, whatever the pod's
// restartPolicy. Kubernetes supports no running container across a minor
// kubelet upgrade; most versions keep them running, this one does not.
//
// terminationTakes is a node whose pods finish their work on SIGTERM, as
// most workloads do: a simulated pod deleted there (an eviction) goes on
// running, and stays in the API as Terminating, this long (at most its
// deletion's grace period, 30 s by default, as a kubelet kills it then).
// Without it a simulated pod stops at once. A pod run as a process stops
// when its process does, as before. A pod that finishes its work records
// pod-stopped in events.jsonl; one whose node goes down first (a reboot)
// records pod-cut: its work was lost.
//
// unpublished is the registries' side, shared by every node: a pull of a
// reference listed (or of any tag of a repository listed without a tag or
// digest) fails as a registry's "manifest unknown" makes it fail, on top of
// what the simulated registries do not serve anyway (package machine,
// images.go). An image a node pulled before the fault stays in its store.
package faults

import (
	"fmt"
	"os"
	"sync"
	"time"

	"sigs.k8s.io/yaml"
)

// Node is the set of faults of one node. The zero value injects nothing.
type Node struct {
	ApplyBlocks           bool     `json:"applyBlocks,omitempty"`
	NeverReady            []string `json:"neverReady,omitempty"`
	StayNotReady          bool     `json:"stayNotReady,omitempty"`
	RestartsContainers    bool     `json:"restartsContainers,omitempty"` // see the package comment
	PullFails             bool     `json:"pullFails,omitempty"`
	UnreachableAfterApply Duration `json:"unreachableAfterApply,omitempty"`
	Unreachable           bool     `json:"unreachable,omitempty"`
	ABFallback            bool     `json:"abFallback,omitempty"`
	NeverBoots            bool     `json:"neverBoots,omitempty"`
	UpgradeUnavailable    bool     `json:"upgradeUnavailable,omitempty"` // see the package comment
	InstallHangs          bool     `json:"installHangs,omitempty"`       // see the package comment
	InstallTakes          Duration `json:"installTakes,omitempty"`
	LogSlow               Duration `json:"logSlow,omitempty"`
	EtcdStopped           bool     `json:"etcdStopped,omitempty"`
	EtcdAlarm             string   `json:"etcdAlarm,omitempty"`
	EtcdStalled           bool     `json:"etcdStalled,omitempty"`
	EtcdStatusLatency     Duration `json:"etcdStatusLatency,omitempty"`
	PoweredOff            bool     `json:"poweredOff,omitempty"`
	TerminationTakes      Duration `json:"terminationTakes,omitempty"` // see the package comment
}

// NeverReadyComponent reports whether component never gets Ready on this node.
func (n Node) NeverReadyComponent(component string) bool {
	for _, c := range n.NeverReady {
		if c == component {
			return true
		}
	}
	return false
}

// File is the faults file's document.
type File struct {
	Nodes map[string]Node `json:"nodes"`
	// Unpublished lists image references no registry serves (see the
	// package comment).
	Unpublished []string `json:"unpublished,omitempty"`
	// APIServerDown stops the cluster's kube-apiserver (SIGTERM, as a static
	// pod's restart does) while set; cleared, it starts again: an apiserver
	// restart that lasts as long as the fault. Every client of the cluster,
	// the simulated kubelets and the runner among them, sees the API gone.
	APIServerDown bool `json:"apiServerDown,omitempty"`
}

// Duration is a time.Duration written as "20s" in the file.
type Duration struct{ time.Duration }

// UnmarshalJSON parses a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := yaml.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %w (write it like 20s or 1m)", s, err)
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(`"` + d.String() + `"`), nil }

// Parse parses a faults document.
func Parse(b []byte) (File, error) {
	var f File
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return File{}, err
	}
	return f, nil
}

// Store serves the faults of a file, re-reading it when its modification time
// or size changes. A Store with no path injects nothing. It is safe for
// concurrent use; a file that no longer parses keeps the last good faults.
type Store struct {
	path string

	mu      sync.Mutex
	modTime time.Time
	size    int64
	current File
}

// Load reads path (empty: no faults) and returns a Store over it. A file that
// does not exist yet is allowed: it is read once it appears.
func Load(path string) (*Store, error) {
	s := &Store{path: path}
	if path == "" {
		return s, nil
	}
	if _, err := os.Stat(path); err == nil {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		if _, err := Parse(b); err != nil {
			return nil, fmt.Errorf("faults file %s: %w", path, err)
		}
	}
	s.refresh()
	return s, nil
}

// For returns the current faults of node.
func (s *Store) For(node string) Node {
	if s == nil || s.path == "" {
		return Node{}
	}
	s.refresh()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current.Nodes[node]
}

// Unpublished returns the references the registries no longer serve.
func (s *Store) Unpublished() []string {
	if s == nil || s.path == "" {
		return nil
	}
	s.refresh()
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.current.Unpublished...)
}

// APIServerDown reports whether the kube-apiserver is to be down.
func (s *Store) APIServerDown() bool {
	if s == nil || s.path == "" {
		return false
	}
	s.refresh()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current.APIServerDown
}

func (s *Store) refresh() {
	st, err := os.Stat(s.path)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if os.IsNotExist(err) {
			s.current, s.modTime, s.size = File{}, time.Time{}, 0
		}
		return
	}
	if st.ModTime().Equal(s.modTime) && st.Size() == s.size {
		return
	}
	b, err := os.ReadFile(s.path)
	if err != nil {
		return
	}
	f, err := Parse(b)
	if err != nil {
		return
	}
	s.current, s.modTime, s.size = f, st.ModTime(), st.Size()
}
