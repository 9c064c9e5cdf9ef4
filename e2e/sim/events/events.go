// Package events writes events.jsonl: one JSON line for every start of a
// component at a version on a node, and for every cordon and uncordon of a
// Node. It is written by the simulator alone, so a test can check the
// upgrade invariant (and what was made unavailable) independently of the
// runner.
package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"
)

// Components that appear in the log.
const (
	APIServer         = "kube-apiserver"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
	KubeProxy         = "kube-proxy"
	Kubelet           = "kubelet"
	Talos             = "talos"
	// TalosInstall is an install of a Talos version into a machine's other
	// boot slot (LifecycleService.Upgrade or MachineService.Upgrade), once its
	// installer runs: one line per install. An Upgrade call whose caller went
	// away before the installer started installs nothing and is not one.
	TalosInstall = "talos-install"
	// Cordon is a change of a Node's spec.unschedulable, as the cluster saw
	// it: version Cordoned or Uncordoned.
	Cordon = "cordon"
	// PodStopped is a simulated pod that took time to stop on SIGTERM
	// (faults.Node.TerminationTakes) having finished its work: version is its
	// "namespace/name".
	PodStopped = "pod-stopped"
	// PodCut is such a pod whose work its node's reboot cut short: version is
	// its "namespace/name". A drain before a reboot waits for its pods to stop,
	// so an upgrade never causes one.
	PodCut = "pod-cut"
)

// The versions of a Cordon event.
const (
	Cordoned   = "cordoned"
	Uncordoned = "uncordoned"
)

// Event is one line of events.jsonl.
type Event struct {
	Time      time.Time `json:"time"`
	Node      string    `json:"node"`
	Component string    `json:"component"`
	Version   string    `json:"version"`
}

// MarshalJSON writes the time as RFC 3339 with nanoseconds.
func (e Event) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Time      string `json:"time"`
		Node      string `json:"node"`
		Component string `json:"component"`
		Version   string `json:"version"`
	}{e.Time.UTC().Format(time.RFC3339Nano), e.Node, e.Component, e.Version})
}

// Log appends events to a file. It is safe for concurrent use. A nil *Log
// records nothing, which keeps unit tests free of files.
type Log struct {
	mu sync.Mutex
	f  *os.File
}

// Open opens (creating or appending to) the events file at path.
func Open(path string) (*Log, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open events log: %w", err)
	}
	return &Log{f: f}, nil
}

// Start records that component started at version on node. It writes a line
// for every call: a restart at the same version is a start too.
func (l *Log) Start(node, component, version string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b, _ := json.Marshal(Event{Time: time.Now(), Node: node, Component: component, Version: version})
	_, _ = l.f.Write(append(b, '\n'))
}

// Close closes the file.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	return l.f.Close()
}

// Read parses an events.jsonl file.
func Read(path string) ([]Event, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Event
	dec := json.NewDecoder(bytes.NewReader(b))
	for dec.More() {
		var e Event
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		out = append(out, e)
	}
	return out, nil
}
