package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// This file is the OS side of the fake cluster, for the Talos upgrade's
// tests: each machine has a running Talos version and a boot ID, an Upgrade
// stages the installer's version and reboots the machine (down for a moment,
// its Node NotReady, then up with a new boot ID, the new osImage and Ready),
// and etcd lists every control plane. Faults: an A/B fallback, a machine
// that never boots, an unreachable API, learners. The install and the
// reboot are fake_talos_install_test.go, etcd fake_talos_etcd_test.go.

// osFaults are what a fake machine's OS does wrong.
type osFaults struct {
	abFallback  bool // an upgrade boots back into the old version
	neverBoots  bool // a reboot keeps the machine down while set
	unreachable bool // the Talos API refuses connections while set
	// refusals is how many more calls of a method ("Installed", "BootID")
	// answer Unavailable (connection refused), as a node whose apid restarts
	// or that is power-cycled at that moment.
	refusals     map[string]int
	upgradeFails bool // the Install call fails (the installer exits non-zero)
	// installBreaks: the Install call installs, then answers Unavailable
	// (the stream reset), while set.
	installBreaks bool
	// logRolled: machined's log no longer reaches back to the boot's start
	// (and holds no install) while set.
	logRolled bool
	// logSlow: reading machined's log answers nothing until the caller gives
	// up, while set.
	logSlow bool
	// installHangs: the Install call installs, then answers nothing until
	// its caller gives up (its deadline), while set.
	installHangs bool
	// installTakes: an install runs this long on the node, whether its
	// caller waits or not (Talos runs the installer to its end).
	installTakes time.Duration
	learner      bool // this control plane is an etcd learner while set
	// learnerAfterBoot keeps this control plane a learner this long after
	// each boot.
	learnerAfterBoot time.Duration
	// bootsVersion: a reboot boots this version, whatever was installed (an
	// install over ichor's that nobody chose).
	bootsVersion string
	// stayNotReady keeps the Node NotReady after a boot.
	stayNotReady bool
	// etcdStopped: its etcd runs no more (its status call times out), but the
	// member stays listed.
	etcdStopped bool
	// etcdAlarm is an alarm its member raised ("NOSPACE").
	etcdAlarm string
	// etcdLag is how far its raft index trails the leader's.
	etcdLag uint64
	// etcdStalled: its raft index stays where its first status under the
	// fault found it, while the others move (fakeOS.raftRate).
	etcdStalled bool
	// etcdStatusDelay: its status is read, and answered, this late.
	etcdStatusDelay time.Duration
	// rebootLag keeps the machine up, on the same boot, this long after its
	// Upgrade call returned (as Talos does while it shuts down).
	rebootLag time.Duration
	// legacy: a Talos before 1.13 (no LifecycleService): Install is
	// MachineService.Upgrade, which answers at once and reboots the machine
	// by itself after rebootLag, its sequence in machined's log; a call
	// while a sequence runs answers too and does nothing (Talos' lock).
	// installBreaks then starts the sequence and answers Unavailable.
	legacy bool
}

// osMachine is one machine's OS.
type osMachine struct {
	name         string
	controlPlane bool
	version      string
	bootID       string
	bootedAt     time.Time
	up           bool
	boots        int
	faults       osFaults
	// staged is the version installed into the other boot slot in this
	// boot ("": none), stagedImage its installer; installing is an Install
	// under way.
	staged      string
	stagedImage string
	installing  bool
	installed   talos.InstallState // machined's log of this boot's installs
	// image is the installer of the last install in machined's log.
	image     string
	stalledAt uint64 // the raft index an etcdStalled member stays at (0: not yet read)
	rebooting bool
	reboots   int // Reboot calls that took
	// rebootedWithPods counts the workload pods (a ReplicaSet's) on the node,
	// Terminating ones among them, at each Reboot call that took.
	rebootedWithPods int
	// runs is what Installed reports (platform metal, no extensions
	// unless a test sets them).
	runs talos.Installed
}

// fakeOS is the Talos API of a fake cluster with an OS side.
type fakeOS struct {
	*fakeTalos

	f           *fakeCluster
	rebootDelay time.Duration
	done        chan struct{}
	wg          sync.WaitGroup

	mu       sync.Mutex
	machines map[string]*osMachine // by name
	upgrades []string              // "node image" of every Install that took
	reboots  []string              // "node version" of every boot after an upgrade, in order
	// unavailable is, at each Upgrade that took, the nodes cordoned by
	// ichor then (the node itself included).
	unavailable [][]string
	// raftRate is how many raft entries a second the cluster writes: the
	// members' indexes move by it (0: they stay at 5000).
	raftRate float64
	started  time.Time
	// onUpgrade, when set, is called at every Install call before it acts.
	// An error fails the call: before it acts with skip (nothing happened on
	// the node), else after (a runner stopped mid-call while the node went
	// on).
	onUpgrade func(ctx context.Context, node string) (skip bool, err error)
	// installedBarrier, when set, holds every Installed call (see
	// callBarrier).
	installedBarrier *callBarrier
}

// newFakeOS returns a fake cluster with an OS side: every machine runs
// spec.talos.
func newFakeOS(t *testing.T, spec clusterSpec) *fakeOS {
	t.Helper()

	f := newFakeCluster(t, spec)
	o := &fakeOS{fakeTalos: (*fakeTalos)(f), f: f, rebootDelay: 20 * time.Millisecond, done: make(chan struct{}), machines: map[string]*osMachine{}, started: time.Now()}

	for i, m := range f.machines {
		// Booted from the installer of its version: newFakeCluster generates
		// configs with WithInstallImage.
		o.machines[m.name] = &osMachine{
			name: m.name, controlPlane: m.controlPlane, version: m.talos,
			bootID: fmt.Sprintf("%08d-boot-%s-0", i, m.name), up: true, installed: talos.InstallNone,
			runs: talos.Installed{Platform: "metal"},
		}
	}

	t.Cleanup(func() {
		close(o.done)
		o.wg.Wait()
	})

	return o
}

// machine returns the OS of the machine named name or addressed by ip.
func (o *fakeOS) machine(nameOrIP string) *osMachine {
	name := o.f.machine(nameOrIP).name

	o.mu.Lock()
	defer o.mu.Unlock()

	return o.machines[name]
}

// setFaults changes a machine's faults.
func (o *fakeOS) setFaults(name string, fn func(*osFaults)) {
	o.mu.Lock()
	defer o.mu.Unlock()

	fn(&o.machines[name].faults)
}

// state returns a copy of a machine's OS.
func (o *fakeOS) state(name string) osMachine {
	m := o.machine(name)

	o.mu.Lock()
	defer o.mu.Unlock()

	return *m
}

// reachable returns the machine, or the error a caller of a machine that is
// down or unreachable gets.
func (o *fakeOS) reachable(ctx context.Context, ip string) (*osMachine, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}

	var m *osMachine

	for _, fm := range o.f.machines {
		if fm.name == ip || fm.ip == ip {
			m = o.machine(ip)
		}
	}

	o.mu.Lock()
	defer o.mu.Unlock()

	if m == nil || !m.up || m.faults.unreachable {
		return nil, status.Errorf(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp %s:50000: connect: connection refused\"", ip)
	}

	return m, nil
}

func (o *fakeOS) Version(ctx context.Context, ip string) (string, error) {
	m, err := o.reachable(ctx, ip)
	if err != nil {
		return "", fmt.Errorf("node %q: version: %w", ip, err)
	}

	o.mu.Lock()
	defer o.mu.Unlock()

	return m.version, nil
}

func (o *fakeOS) MachineConfig(ctx context.Context, ip string) (config.Provider, error) {
	if _, err := o.reachable(ctx, ip); err != nil {
		return nil, fmt.Errorf("node %q: read machine config: %w", ip, err)
	}

	return o.fakeTalos.MachineConfig(ctx, ip)
}

// refused consumes one of a machine's refusals of call.
func (o *fakeOS) refused(ip, call string) error {
	m := o.machine(ip)

	o.mu.Lock()
	defer o.mu.Unlock()

	if m == nil || m.faults.refusals[call] == 0 {
		return nil
	}

	m.faults.refusals[call]--

	return status.Errorf(codes.Unavailable, "connection error: desc = \"transport: Error while dialing: dial tcp %s:50000: connect: connection refused\"", ip)
}

func (o *fakeOS) BootID(ctx context.Context, ip string) (string, error) {
	if err := o.refused(ip, "BootID"); err != nil {
		return "", fmt.Errorf("node %q: read boot id: %w", ip, err)
	}

	m, err := o.reachable(ctx, ip)
	if err != nil {
		return "", fmt.Errorf("node %q: read boot id: %w", ip, err)
	}

	o.mu.Lock()
	defer o.mu.Unlock()

	return m.bootID, nil
}

func (o *fakeOS) Installed(ctx context.Context, ip string) (talos.Installed, error) {
	if o.installedBarrier != nil {
		o.installedBarrier.arrive()
	}

	if err := o.refused(ip, "Installed"); err != nil {
		return talos.Installed{}, fmt.Errorf("node %q: list extensions: %w", ip, err)
	}

	m, err := o.reachable(ctx, ip)
	if err != nil {
		return talos.Installed{}, fmt.Errorf("node %q: list extensions: %w", ip, err)
	}

	o.mu.Lock()
	defer o.mu.Unlock()

	return m.runs, nil
}

// callBarrier holds each call until want calls have come (then lets every
// one go, and every later one at once), or until limit passes for it: then
// it lets it go and counts that it gave up.
type callBarrier struct {
	want   int
	limit  time.Duration
	mu     sync.Mutex
	in     int
	met    chan struct{}
	gaveUp int
}

func newCallBarrier(want int, limit time.Duration) *callBarrier {
	return &callBarrier{want: want, limit: limit, met: make(chan struct{})}
}

func (b *callBarrier) arrive() {
	b.mu.Lock()
	b.in++

	if b.in == b.want {
		close(b.met)
	}
	b.mu.Unlock()

	select {
	case <-b.met:
	case <-time.After(b.limit):
		b.mu.Lock()
		b.gaveUp++
		b.mu.Unlock()
	}
}

// gaveUpOn is how many calls the barrier let go after its limit.
func (b *callBarrier) gaveUpOn() int {
	b.mu.Lock()
	defer b.mu.Unlock()

	return b.gaveUp
}

// setNode changes a Node's status.
func (o *fakeOS) setNode(name string, fn func(*corev1.Node)) {
	n, err := o.f.cs.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(o.f.t, err)

	fn(n)

	_, err = o.f.cs.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
	require.NoError(o.f.t, err)
}

// setOS puts a machine on version (its Node's osImage too), as if upgraded
// before the test.
func (o *fakeOS) setOS(name, version string) {
	o.mu.Lock()
	o.machines[name].version = version
	o.mu.Unlock()

	o.setNode(name, func(n *corev1.Node) { n.Status.NodeInfo.OSImage = fmt.Sprintf("Talos (%s)", version) })
}

// upgradeNodes returns the nodes of the Upgrade calls that took, in order.
func (o *fakeOS) upgradeNodes() []string {
	o.mu.Lock()
	defer o.mu.Unlock()

	out := make([]string, 0, len(o.upgrades))
	for _, u := range o.upgrades {
		out = append(out, strings.Fields(u)[0])
	}

	return out
}

// rebootNodes returns the nodes of the boots after an upgrade, in order.
func (o *fakeOS) rebootNodes() []string {
	o.mu.Lock()
	defer o.mu.Unlock()

	out := make([]string, 0, len(o.reboots))
	for _, r := range o.reboots {
		out = append(out, strings.Fields(r)[0])
	}

	return out
}

// engine returns an Engine for a Talos upgrade over the fake with short
// bounds, keeping its marks in memo. A fake with fewer than 3 control planes
// accepts the etcd outage (the tests of other things run on small clusters;
// TestTalosEtcdQuorum shows the refusal without it).
func (o *fakeOS) engine(target string, memo *mapMemo, mutate ...func(*Options)) *Engine {
	controlPlanes := 0

	for _, m := range o.f.machines {
		if m.controlPlane {
			controlPlanes++
		}
	}

	opts := Options{
		Kind: KindTalos, Target: target, MaxUnavailable: 1, AllowEtcdOutage: controlPlanes < 3,
		VerifyTimeout: 5 * time.Second, DrainTimeout: 5 * time.Second, UpgradeTimeout: 5 * time.Second, RebootTimeout: 5 * time.Second,
	}

	for _, fn := range mutate {
		fn(&opts)
	}

	return &Engine{Kube: o.f.cs, Talos: o, Options: opts, Memo: memo, evictRetryDelay: time.Millisecond, talosPoll: time.Millisecond, etcdGap: time.Millisecond}
}
