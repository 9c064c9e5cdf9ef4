package main

// peer.go runs the peer, talosctl upgrade-k8s (built by make cluster-bins
// from Talos' own source), on a cluster identical to kubectl-ichor's: the
// same size, versions, latencies and workload. talosctl drains nothing and
// moves the kubelets one at a time; it is timed from its start to its exit,
// and its progress lines are timed as they are printed, for its timeline.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/cluster"
)

// PeerResult is talosctl upgrade-k8s on an identical cluster.
type PeerResult struct {
	Command             string  `json:"command"`
	ClusterStartSeconds float64 `json:"clusterStartSeconds,omitempty"`
	LoadAvgBefore       string  `json:"loadAverageBefore,omitempty"`
	LoadAvgAfter        string  `json:"loadAverageAfter,omitempty"`
	// WallSeconds is the command's, from its start to its exit.
	WallSeconds float64 `json:"wallSeconds"`
	// Timeline is the run's picture, a file beside upgrade.json.
	Timeline string `json:"timeline,omitempty"`
	Error    string `json:"error,omitempty"`
}

// peerSize runs talosctl upgrade-k8s on a cluster of n nodes.
func peerSize(ctx context.Context, o options, n int) *PeerResult {
	p := &PeerResult{Command: fmt.Sprintf("talosctl upgrade-k8s --to %s", strings.TrimPrefix(toVersion, "v"))}
	cr := clusterRun{
		what: fmt.Sprintf("talosctl upgrade-k8s %d nodes", n), nodes: n, logs: fmt.Sprintf("talosctl-logs-%d-nodes", n), keep: o.keepLogs,
		flags: upgradeClusterFlags(o),
	}

	err := withCluster(ctx, o, cr, func(c *simCluster) error {
		p.ClusterStartSeconds = c.startSeconds

		return peerOnce(ctx, o, c, n, p)
	})
	if err != nil {
		p.Error = err.Error()
	}

	return p
}

func peerOnce(ctx context.Context, o options, c *simCluster, n int, p *PeerResult) error {
	client, err := newClient(c.kubeconfig)
	if err != nil {
		return err
	}

	if err := addWorkload(ctx, client, int32(n-controlPlanes)); err != nil {
		return err
	}

	names := map[string]string{}
	first := ""

	for _, m := range c.info.Machines {
		names[m.IP] = m.Name
		if m.ControlPlane && first == "" {
			first = m.IP
		}
	}

	if first == "" {
		return fmt.Errorf("%s names no control plane", cluster.ReadyFile)
	}

	p.LoadAvgBefore = loadAvg()

	upCtx, cancel := context.WithTimeout(ctx, upgradeTimeout)
	defer cancel()

	// As an operator runs it: against the first control plane, which
	// discovers the others.
	cmd := exec.CommandContext(upCtx, o.talosctl, "--talosconfig", c.talosconfig, "-n", first,
		"upgrade-k8s", "--to", strings.TrimPrefix(toVersion, "v"))
	cmd.Env = append(cleanEnviron(), "HOME="+c.home)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	var lines timedLines

	cmd.Stdout, cmd.Stderr = &lines, &lines

	began := time.Now()
	err = cmd.Run()
	ended := time.Now()
	p.WallSeconds = round(ended.Sub(began).Seconds())
	p.LoadAvgAfter = loadAvg()

	_ = os.WriteFile(filepath.Join(c.dir, cluster.LogDir, "talosctl.out"), lines.raw.Bytes(), 0o644)

	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (the benchmark was interrupted)", err)
		}

		return fmt.Errorf("talosctl upgrade-k8s: %v: %s", err, lastLine(lines.raw.Bytes()))
	}

	// It says it succeeded: hold it to that.
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}

	for _, node := range nodes.Items {
		if v := node.Status.NodeInfo.KubeletVersion; v != toVersion {
			return fmt.Errorf("talosctl upgrade-k8s succeeded, but node %q runs kubelet %s, not %s", node.Name, v, toVersion)
		}
	}

	fmt.Fprintf(os.Stderr, "bench: talosctl upgrade-k8s %d nodes: upgraded in %.1fs\n", n, p.WallSeconds)

	t := peerTimeline(lines.lines(), names, began, ended)
	t.Title = fmt.Sprintf("talosctl upgrade-k8s --to %s, %d+%d nodes", strings.TrimPrefix(toVersion, "v"), controlPlanes, n-controlPlanes)
	t.Subtitle = fmt.Sprintf("wall %.1fs; %s -> %s on Talos %s; load average %s at the start, %s at the end",
		p.WallSeconds, fromVersion, toVersion, talosVersion, p.LoadAvgBefore, p.LoadAvgAfter)

	name := fmt.Sprintf("timeline-%d-nodes-talosctl.svg", n)
	if err := os.WriteFile(filepath.Join(o.out, name), svgTimeline(t), 0o644); err != nil {
		return err
	}

	p.Timeline = name

	return nil
}

// timedLines is a command's output, kept whole and as lines timed when
// they were written.
type timedLines struct {
	mu      sync.Mutex
	raw     bytes.Buffer
	partial []byte
	timed   []peerLine
}

// Write keeps p and times each line it completes.
func (l *timedLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()

	now := time.Now()
	l.raw.Write(p)
	l.partial = append(l.partial, p...)

	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}

		l.timed = append(l.timed, peerLine{at: now, text: string(l.partial[:i])})
		l.partial = l.partial[i+1:]
	}

	return len(p), nil
}

func (l *timedLines) lines() []peerLine {
	l.mu.Lock()
	defer l.mu.Unlock()

	return l.timed
}
