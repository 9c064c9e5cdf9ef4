package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
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

	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// This file is the OS side of the fake cluster, for the Talos upgrade's
// tests: each machine has a running Talos version and a boot ID, an Upgrade
// stages the installer's version and reboots the machine (down for a moment,
// its Node NotReady, then up with a new boot ID, the new osImage and Ready),
// and etcd lists every control plane. Faults: an A/B fallback, a machine
// that never boots, an unreachable API, learners.

// The Kubernetes fake has no OS side: the Talos upgrade's tests use fakeOS.

func (ft *fakeTalos) BootID(context.Context, string) (string, error) {
	return "", errors.New("fake talos: no OS side (use fakeOS)")
}

func (ft *fakeTalos) EtcdMembers(context.Context, string) ([]talos.EtcdMember, error) {
	return nil, errors.New("fake talos: no OS side (use fakeOS)")
}

func (ft *fakeTalos) EtcdStatus(context.Context, string) (talos.EtcdStatus, error) {
	return talos.EtcdStatus{}, errors.New("fake talos: no OS side (use fakeOS)")
}

func (ft *fakeTalos) EtcdAlarms(context.Context, string) ([]talos.EtcdAlarm, error) {
	return nil, errors.New("fake talos: no OS side (use fakeOS)")
}

func (ft *fakeTalos) Install(context.Context, string, string) (bool, error) {
	return false, errors.New("fake talos: no OS side (use fakeOS)")
}

func (ft *fakeTalos) Reboot(context.Context, string) error {
	return errors.New("fake talos: no OS side (use fakeOS)")
}

func (ft *fakeTalos) InstallEvidence(context.Context, string) (talos.Evidence, error) {
	return talos.Evidence{}, errors.New("fake talos: no OS side (use fakeOS)")
}

func (ft *fakeTalos) Installed(context.Context, string) (talos.Installed, error) {
	return talos.Installed{}, errors.New("fake talos: no OS side (use fakeOS)")
}

// osFaults are what a fake machine's OS does wrong.
type osFaults struct {
	abFallback   bool // an upgrade boots back into the old version
	neverBoots   bool // a reboot keeps the machine down while set
	unreachable  bool // the Talos API refuses connections while set
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

func (o *fakeOS) BootID(ctx context.Context, ip string) (string, error) {
	m, err := o.reachable(ctx, ip)
	if err != nil {
		return "", fmt.Errorf("node %q: read boot id: %w", ip, err)
	}

	o.mu.Lock()
	defer o.mu.Unlock()

	return m.bootID, nil
}

func (o *fakeOS) EtcdMembers(ctx context.Context, ip string) ([]talos.EtcdMember, error) {
	self, err := o.reachable(ctx, ip)
	if err != nil {
		return nil, fmt.Errorf("node %q: list etcd members: %w", ip, err)
	}

	if !self.controlPlane {
		return nil, fmt.Errorf("node %q: list etcd members: %w", ip, status.Error(codes.FailedPrecondition, "etcd is not running on this node"))
	}

	o.mu.Lock()
	defer o.mu.Unlock()

	var out []talos.EtcdMember

	for i, fm := range o.f.machines {
		m := o.machines[fm.name]
		if !m.controlPlane {
			continue
		}

		learner := m.faults.learner || (m.faults.learnerAfterBoot > 0 && time.Since(m.bootedAt) < m.faults.learnerAfterBoot)
		out = append(out, talos.EtcdMember{ID: uint64(i + 1), Hostname: m.name, IsLearner: learner})
	}

	return out, nil
}

// etcdMember returns the control plane's member ID (its index + 1) and
// whether it is a learner now; the caller holds o.mu.
func (o *fakeOS) etcdMember(name string) (uint64, bool) {
	for i, fm := range o.f.machines {
		if fm.name == name {
			m := o.machines[name]

			return uint64(i + 1), m.faults.learner || (m.faults.learnerAfterBoot > 0 && time.Since(m.bootedAt) < m.faults.learnerAfterBoot)
		}
	}

	return 0, false
}

// EtcdStatus is the control plane's own member: the first control plane
// leads, at raft index 5000 and on by raftRate entries a second; a stopped
// etcd answers nothing until the caller gives up.
func (o *fakeOS) EtcdStatus(ctx context.Context, ip string) (talos.EtcdStatus, error) {
	self, err := o.reachable(ctx, ip)
	if err != nil {
		return talos.EtcdStatus{}, fmt.Errorf("node %q: etcd status: %w", ip, err)
	}

	o.mu.Lock()
	stopped, delay := self.faults.etcdStopped, self.faults.etcdStatusDelay
	o.mu.Unlock()

	if !self.controlPlane {
		return talos.EtcdStatus{}, fmt.Errorf("node %q: etcd status: %w", ip, status.Error(codes.FailedPrecondition, "etcd is not running on this node"))
	}

	if stopped {
		<-ctx.Done()

		return talos.EtcdStatus{}, fmt.Errorf("node %q: etcd status: %w", ip, status.FromContextError(ctx.Err()).Err())
	}

	if delay > 0 {
		select {
		case <-ctx.Done():
			return talos.EtcdStatus{}, fmt.Errorf("node %q: etcd status: %w", ip, status.FromContextError(ctx.Err()).Err())
		case <-time.After(delay):
		}
	}

	o.mu.Lock()
	defer o.mu.Unlock()

	index := 5000 + uint64(o.raftRate*time.Since(o.started).Seconds()) - self.faults.etcdLag

	switch {
	case !self.faults.etcdStalled:
		self.stalledAt = 0
	case self.stalledAt == 0:
		self.stalledAt = index
	default:
		index = self.stalledAt
	}

	id, learner := o.etcdMember(self.name)
	s := talos.EtcdStatus{MemberID: id, Leader: 1, RaftIndex: index, RaftTerm: 2, IsLearner: learner}

	for _, m := range o.machines {
		if m.faults.etcdAlarm != "" {
			mid, _ := o.etcdMember(m.name)
			s.Errors = append(s.Errors, fmt.Sprintf("memberID:%d alarm:%s ", mid, m.faults.etcdAlarm))
		}
	}

	return s, nil
}

// EtcdAlarms lists every member's alarm.
func (o *fakeOS) EtcdAlarms(ctx context.Context, ip string) ([]talos.EtcdAlarm, error) {
	if _, err := o.reachable(ctx, ip); err != nil {
		return nil, fmt.Errorf("node %q: etcd alarm list: %w", ip, err)
	}

	o.mu.Lock()
	defer o.mu.Unlock()

	var out []talos.EtcdAlarm

	for _, m := range o.machines {
		if m.faults.etcdAlarm != "" {
			id, _ := o.etcdMember(m.name)
			out = append(out, talos.EtcdAlarm{MemberID: id, Alarm: m.faults.etcdAlarm})
		}
	}

	return out, nil
}

func (o *fakeOS) Installed(ctx context.Context, ip string) (talos.Installed, error) {
	m, err := o.reachable(ctx, ip)
	if err != nil {
		return talos.Installed{}, fmt.Errorf("node %q: list extensions: %w", ip, err)
	}

	o.mu.Lock()
	defer o.mu.Unlock()

	return m.runs, nil
}

// Install stages the installer's version into the other boot slot, as
// LifecycleService.Upgrade does: the machine runs on until its Reboot. A
// second Install while one runs is refused as Talos does; every Install that
// took is counted.
func (o *fakeOS) Install(ctx context.Context, ip, image string) (bool, error) {
	if _, ok := ctx.Deadline(); !ok {
		return false, errors.New("fake talos: an Install without its own deadline")
	}

	m, err := o.reachable(ctx, ip)
	if err != nil {
		return false, fmt.Errorf("node %q: upgrade: %w", ip, err)
	}

	o.mu.Lock()
	legacy := m.faults.legacy
	o.mu.Unlock()

	if legacy {
		return o.legacyUpgrade(ctx, m, ip, image)
	}

	o.mu.Lock()
	fails, breaks, hook, busy := m.faults.upgradeFails, m.faults.installBreaks, o.onUpgrade, m.installing
	hangs, takes := m.faults.installHangs, m.faults.installTakes
	if !busy {
		m.installing, m.image = true, image
	}
	o.mu.Unlock()

	if busy {
		return false, fmt.Errorf("node %q: upgrade: %w", ip, status.Error(codes.FailedPrecondition, "another installation/upgrade is already in progress"))
	}

	// The install ends here, or (installTakes) where its installer ends.
	detached := false

	defer func() {
		if detached {
			return
		}

		o.mu.Lock()
		m.installing = false
		o.mu.Unlock()
	}()

	if fails {
		o.mu.Lock()
		m.installed = talos.InstallFailed
		o.mu.Unlock()

		return false, fmt.Errorf("node %q: upgrade to %s: the installer exited with code 1", ip, image)
	}

	var after error

	if hook != nil {
		skip, err := hook(ctx, m.name)
		if skip {
			return false, fmt.Errorf("node %q: upgrade to %s: %w", ip, image, err)
		}

		after = err
	}

	cordoned := o.f.cordonedByIchor()

	install := func() {
		o.mu.Lock()
		o.upgrades = append(o.upgrades, m.name+" "+image)
		o.unavailable = append(o.unavailable, cordoned)
		m.staged, m.stagedImage = render.TagOf(image), image
		m.installed = talos.InstallDone
		m.installing = false
		o.mu.Unlock()
	}

	if takes > 0 {
		// Talos runs the installer to its end whether its caller waits or not.
		detached = true
		done := make(chan struct{})

		o.wg.Add(1)

		go func() {
			defer o.wg.Done()
			defer close(done)

			select {
			case <-o.done:
				return
			case <-time.After(takes):
			}

			install()
		}()

		select {
		case <-done:
		case <-ctx.Done():
			return false, fmt.Errorf("node %q: upgrade to %s: %w", ip, image, status.FromContextError(ctx.Err()).Err())
		}
	} else {
		install()
	}

	if hangs {
		<-ctx.Done()

		return false, fmt.Errorf("node %q: upgrade to %s: %w", ip, image, status.FromContextError(ctx.Err()).Err())
	}

	if after == nil && breaks {
		after = status.Error(codes.Unavailable, "error reading from server: read tcp: connection reset by peer")
	}

	return false, after
}

// legacyUpgrade is MachineService.Upgrade (osFaults.legacy).
func (o *fakeOS) legacyUpgrade(ctx context.Context, m *osMachine, ip, image string) (bool, error) {
	o.mu.Lock()
	locked, breaks, hook := m.rebooting, m.faults.installBreaks, o.onUpgrade
	o.mu.Unlock()

	var after error

	if hook != nil {
		skip, err := hook(ctx, m.name)
		if skip {
			return true, fmt.Errorf("node %q: upgrade to %s: %w", ip, image, err)
		}

		after = err
	}

	o.mu.Lock()

	if !locked {
		o.upgrades = append(o.upgrades, m.name+" "+image)
		m.staged, m.stagedImage = render.TagOf(image), image
		m.installed = talos.InstallSequence
		m.reboots-- // the sequence's own reboot, not a Reboot call
	}
	o.mu.Unlock()

	if !locked {
		// The sequence runs whatever becomes of the caller.
		if err := o.Reboot(context.WithoutCancel(ctx), ip); err != nil {
			return true, err
		}
	}

	if after == nil && breaks {
		after = fmt.Errorf("node %q: upgrade: %w", ip, status.Error(codes.Unavailable, "error reading from server: read tcp: connection reset by peer"))
	}

	return true, after
}

// InstallEvidence is machined's log of the installs of the current boot.
func (o *fakeOS) InstallEvidence(ctx context.Context, ip string) (talos.Evidence, error) {
	m, err := o.reachable(ctx, ip)
	if err != nil {
		return talos.Evidence{}, fmt.Errorf("node %q: read machined's log: %w", ip, err)
	}

	o.mu.Lock()
	slow := m.faults.logSlow
	o.mu.Unlock()

	if slow {
		<-ctx.Done()

		return talos.Evidence{}, fmt.Errorf("node %q: read machined's log: %w", ip, status.FromContextError(ctx.Err()).Err())
	}

	o.mu.Lock()
	defer o.mu.Unlock()

	switch {
	case m.installing:
		return talos.Evidence{State: talos.InstallRunning, Image: m.image}, nil
	case m.faults.logRolled && m.installed == talos.InstallNone:
		return talos.Evidence{State: talos.InstallUnknown}, nil
	case m.installed == talos.InstallNone || m.installed == talos.InstallUnknown:
		return talos.Evidence{State: m.installed}, nil
	}

	return talos.Evidence{State: m.installed, Image: m.image}, nil
}

// Reboot reboots the machine into its staged version: it goes down at once
// (or after rebootLag, as Talos does while it shuts down) and boots after
// rebootDelay.
func (o *fakeOS) Reboot(ctx context.Context, ip string) error {
	m, err := o.reachable(ctx, ip)
	if err != nil {
		return fmt.Errorf("node %q: reboot: %w", ip, err)
	}

	o.mu.Lock()
	if m.rebooting {
		o.mu.Unlock()

		return fmt.Errorf("node %q: reboot: %w", ip, status.Error(codes.FailedPrecondition, "a reboot is already in progress"))
	}

	staged, lag := m.staged, m.faults.rebootLag
	if staged == "" {
		staged = m.version
	}

	m.rebooting = true
	m.reboots++
	o.mu.Unlock()

	o.wg.Add(1)

	if lag == 0 {
		o.goDown(m)

		go o.boot(m, staged)

		return nil
	}

	go func() {
		select {
		case <-o.done:
			o.wg.Done()

			return
		case <-time.After(lag):
		}

		o.goDown(m)
		o.boot(m, staged)
	}()

	return nil
}

// goDown takes a machine down for its reboot: its API and its Node's Ready
// go.
func (o *fakeOS) goDown(m *osMachine) {
	o.mu.Lock()
	m.up = false
	o.mu.Unlock()

	o.setNode(m.name, func(n *corev1.Node) {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", Message: "node is shutting down"}}
	})
}

// boot brings a machine up after rebootDelay (and while it never boots,
// not at all) with a new boot ID, on staged unless it falls back.
func (o *fakeOS) boot(m *osMachine, staged string) {
	defer o.wg.Done()

	for first := true; ; first = false {
		wait := time.Millisecond
		if first {
			wait = o.rebootDelay
		}

		select {
		case <-o.done:
			return
		case <-time.After(wait):
		}

		o.mu.Lock()
		never := m.faults.neverBoots
		o.mu.Unlock()

		if !never {
			break
		}
	}

	o.mu.Lock()
	switch {
	case m.faults.bootsVersion != "":
		m.version = m.faults.bootsVersion
	case !m.faults.abFallback:
		m.version = staged
		if m.stagedImage != "" {
			m.runs.Extensions = carriedBy(m.stagedImage, m.runs.Extensions)
		}
	}

	m.stagedImage = ""

	m.boots++
	m.bootID = fmt.Sprintf("boot-%s-%d", m.name, m.boots)
	m.staged, m.installed, m.rebooting, m.image = "", talos.InstallNone, false, ""
	m.bootedAt = time.Now()
	m.up = true
	version, notReady := m.version, m.faults.stayNotReady
	o.reboots = append(o.reboots, m.name+" "+version)
	o.mu.Unlock()

	o.setNode(m.name, func(n *corev1.Node) {
		n.Status.NodeInfo.OSImage = fmt.Sprintf("Talos (%s)", version)
		if !notReady {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		}
	})
}

// carriedBy is what a node running exts runs after booting image, as on
// Talos (and the simulator): the factory installer of its schematic keeps
// them, one of another schematic carries that schematic (what else it has
// is not known here), any other installer carries none.
func carriedBy(image string, exts []talos.Extension) []talos.Extension {
	schematic, base, ok := stages.FactorySchematic(image)
	if !ok {
		return nil
	}

	for _, e := range exts {
		if e.Name == "schematic" && e.Version == schematic {
			return exts
		}
	}

	return []talos.Extension{{Name: "schematic", Version: schematic, Author: "Image Factory (https://" + base + ")"}}
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

// mapMemo is a Memo in memory. A Set with its context ended writes nothing,
// as a write to the state that never reached it.
type mapMemo struct {
	mu sync.Mutex
	m  map[string]string
	// refuse, when set, is what every Set fails with (a state write refused).
	refuse error
}

func newMemo() *mapMemo { return &mapMemo{m: map[string]string{}} }

func (m *mapMemo) Get(key string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()

	v, ok := m.m[key]

	return v, ok
}

func (m *mapMemo) Set(ctx context.Context, key, value string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("write the state: %w", err)
	}

	m.mu.Lock()
	defer m.mu.Unlock()

	if m.refuse != nil {
		return fmt.Errorf("write the state: %w", m.refuse)
	}

	m.m[key] = value

	return nil
}

func (m *mapMemo) all() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()

	return maps.Clone(m.m)
}
