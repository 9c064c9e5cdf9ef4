package machine

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/faults"
)

// Defaults of the Options durations.
const (
	DefaultRebootDelay = 3 * time.Second
	// DefaultManifestRenderDelay is Options.ManifestRenderDelay's default.
	DefaultManifestRenderDelay = 3 * time.Second
	DefaultPullLatency         = 200 * time.Millisecond
	// DefaultKubeletRestart is how long the kubelet service is down when it
	// restarts for a new spec.
	DefaultKubeletRestart = 500 * time.Millisecond
	// faultPollInterval is how often a machine that never boots re-reads its
	// faults to see whether the fault was cleared.
	faultPollInterval = 200 * time.Millisecond
	// drainTimeout bounds the BeforeReboot hook.
	drainTimeout = 10 * time.Minute
)

// Options configure a simulated machine.
type Options struct {
	// Name is the hostname and Kubernetes node name, e.g. "cp-1".
	Name string
	// IP is the machine's own loopback address (127.x.y.z); package talosapi
	// serves the Talos API on IP:50000.
	IP netip.Addr
	// ControlPlane tells whether this is a control-plane machine; it must
	// agree with the machine type in Config.
	ControlPlane bool
	// TalosVersion is the Talos version the machine first boots, e.g.
	// "v1.12.4" (with the v).
	TalosVersion string
	// Config is the machine config: multi-document YAML generated with
	// machinery's generate package.
	Config []byte
	// Extensions are the system extensions the machine was installed with
	// (Image Factory's virtual "schematic" one among them when installed
	// from a schematic), served as Talos serves them (ExtensionStatus
	// resources). An upgrade replaces them with what its installer carries
	// (see installerExtensions).
	Extensions []Extension
	// BootedWithUKI is true for a machine that boots a UKI with systemd-boot
	// (SecurityState bootedWithUKI), false for one that boots with GRUB.
	BootedWithUKI bool
	// AdminKubeconfig is returned by the Kubeconfig call (control planes).
	AdminKubeconfig []byte
	// Events records every boot; may be nil.
	Events *events.Log
	// Faults injects per-node faults; may be nil.
	Faults *faults.Store
	// Mirror is the cluster's private registry, when it runs one; may be nil.
	Mirror *Mirror
	// RebootDelay is how long a reboot keeps the machine down (default 3s).
	RebootDelay time.Duration
	// PullLatency is how long an image pull takes (default 200ms).
	PullLatency time.Duration
	// KubeletRestart is how long the kubelet service stays down when Talos
	// restarts it for a new KubeletSpec (default 500ms).
	KubeletRestart time.Duration
	// HealthCheckDelay, when set, replaces the initial delay of every
	// service's first health check (Talos: 1s, the kubelet 2s, etcd 5s).
	HealthCheckDelay time.Duration
	// StaticPodStatusInterval is how often the StaticPodStatus resources
	// are refreshed from the kubelet's view (default 15s, as Talos).
	StaticPodStatusInterval time.Duration
	// Discovery is the cluster's discovery service, shared by its machines
	// (nil: none, the machine has no Member resources).
	Discovery *Discovery
	// ManifestRenderDelay is how long after a config change a control plane
	// re-renders its bootstrap manifests (the Manifest resources), as Talos'
	// controllers do asynchronously (default 3s; the first render of a boot is
	// at once).
	ManifestRenderDelay time.Duration
	// StaticPodApplyWait is how long a NO_REBOOT apply that changes a
	// control-plane static pod blocks before it returns, as Talos does while
	// it restarts the pod (0: it returns at once).
	StaticPodApplyWait time.Duration
	// BeforeReboot, when non-nil, is called before a reboot that Talos drains
	// the node for (the legacy MachineService upgrade sequence): the cluster
	// cordons and drains the node there. Errors are logged, not fatal.
	BeforeReboot func(ctx context.Context) error
	// PowerCycle, when non-nil, is called in every reboot while the machine
	// is down, after RebootDelay and before it boots: the kind e2e restarts
	// the node's container there, so that the machine boots on a node that
	// really restarted. An error is logged; the machine boots anyway.
	PowerCycle func(ctx context.Context) error
	// Log receives the machine's diagnostics; nil discards them.
	Log *slog.Logger
}

// StaticPod is one control-plane static pod as the machine renders it.
type StaticPod struct {
	// Image is the container image of the pod.
	Image string
	// ConfigVersion is the version of the controlplane config resource
	// (APIServerConfig etc.) that produced the pod, as Talos writes into the
	// mirror pod annotation talos.dev/config-version.
	ConfigVersion string
}

// State is a consistent snapshot of a machine.
type State struct {
	// TalosVersion is the running Talos version, e.g. "v1.13.9".
	TalosVersion string
	// BootID is a new random UUID after every boot.
	BootID string
	// Up is false while the machine reboots (API, kubelet and static pods down).
	Up bool
	// KubeletRunning tells whether the kubelet service runs (false while it
	// restarts and while the machine is down).
	KubeletRunning bool
	// Config is the active machine config.
	Config config.Provider
	// ConfigVersion starts at 1 and is incremented by every change of the
	// active config.
	ConfigVersion int
	// StaticPods holds "kube-apiserver", "kube-controller-manager" and
	// "kube-scheduler" on control planes; it is empty on workers.
	StaticPods map[string]StaticPod
	// KubeletImage is machine.kubelet.image of the active config.
	KubeletImage string
	// ProxyImage is cluster.proxy.image of the active config ("" if kube-proxy
	// is disabled). Only control planes render it into the kube-proxy
	// DaemonSet manifest.
	ProxyImage string
	// StagedVersion is the Talos version installed into the other boot slot by
	// an upgrade and taken on the next reboot ("" if none).
	StagedVersion string
	// InstallerImage is the installer image of the last upgrade ("" before any).
	InstallerImage string
	// ConfigStaged tells whether a config applied in STAGED mode waits for the
	// next reboot.
	ConfigStaged bool
	// Extensions are the system extensions of the running boot.
	Extensions []Extension
	// StagedExtensions are those the staged version boots with.
	StagedExtensions []Extension
	// PreviousVersion is the Talos version in the boot slot the machine
	// booted from before its last upgrade ("" before any): what a rollback
	// without a staged install boots; PreviousExtensions those it runs.
	PreviousVersion    string
	PreviousExtensions []Extension
}

// Machine is one simulated Talos machine. It is safe for concurrent use.
type Machine struct {
	opts Options
	log  *slog.Logger
	// cosi is the COSI state of the current boot (see bootState).
	cosi   state.State
	states *bootState
	nodeID string // the node's identity, kept across reboots

	// svcMu guards services and orders their resource writes; statusMu
	// orders the MachineStatus writes, memberMu the Member writes.
	svcMu    sync.Mutex
	services map[string]*serviceRunner
	statusMu sync.Mutex
	memberMu sync.Mutex

	// opMu serialises config changes and boot transitions.
	opMu sync.Mutex

	mu               sync.Mutex
	st               State
	persistent       config.Provider // the config the next boot takes
	rebooting        bool
	unreachableUntil time.Time
	subs             map[uint64]chan struct{}
	nextSub          uint64
	stage            runtime.MachineStage
	kubelet          KubeletView // what the kubelet last showed
	// machinedLog is machined's log of the current boot (talosctl logs
	// machined); installing is a LifecycleService.Upgrade under way.
	machinedLog []string
	installing  bool
	// stagedImage is the installer a staged MachineService.Upgrade left for
	// the next boot (Talos' META tag).
	stagedImage string
	// images is containerd's image store, by namespace then normalized
	// reference: what was pulled, kept across reboots as the disk keeps it.
	images map[string]map[string]bool
	// events is the current boot's runtime event stream (runtime_events.go);
	// lastStatus the MachineStatusEvent published last in it.
	events      *eventStream
	lastStatus  *machineapi.MachineStatusEvent
	eventSeq    atomic.Uint32
	manifestGen uint64 // the latest scheduled manifest render
	// poweredOff is a machine down under the poweredOff fault; joined is
	// one that has booted at least once.
	poweredOff bool
	joined     bool

	ctx    context.Context //nolint:containedctx // lifetime of background work
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New parses the config, renders the machine's COSI resources and boots it
// (recording the first events.Talos start).
func New(opts Options) (*Machine, error) {
	if opts.Name == "" {
		return nil, errors.New("machine: Name is required")
	}
	if !opts.IP.IsValid() {
		return nil, fmt.Errorf("machine %s: IP is required", opts.Name)
	}
	if opts.TalosVersion == "" {
		return nil, fmt.Errorf("machine %s: TalosVersion is required", opts.Name)
	}
	if opts.RebootDelay == 0 {
		opts.RebootDelay = DefaultRebootDelay
	}
	if opts.ManifestRenderDelay == 0 {
		opts.ManifestRenderDelay = DefaultManifestRenderDelay
	}
	if opts.PullLatency == 0 {
		opts.PullLatency = DefaultPullLatency
	}
	if opts.KubeletRestart == 0 {
		opts.KubeletRestart = DefaultKubeletRestart
	}
	if opts.StaticPodStatusInterval == 0 {
		opts.StaticPodStatusInterval = DefaultStaticPodStatusInterval
	}
	logger := opts.Log
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	cfg, err := configloader.NewFromBytes(opts.Config)
	if err != nil {
		return nil, fmt.Errorf("machine %s: parse config: %w", opts.Name, err)
	}
	if cfg.Machine() == nil || cfg.Cluster() == nil {
		return nil, fmt.Errorf("machine %s: config has no v1alpha1 machine and cluster sections", opts.Name)
	}
	// machined refuses to boot with a config that does not validate, as
	// ApplyConfiguration refuses one.
	if _, err := cfg.ValidateAsClient(metalMode{}); err != nil {
		return nil, fmt.Errorf("machine %s: config does not validate: %w", opts.Name, err)
	}
	if got := cfg.Machine().Type().IsControlPlane(); got != opts.ControlPlane {
		return nil, fmt.Errorf("machine %s: config machine type %s does not match ControlPlane=%t", opts.Name, cfg.Machine().Type(), opts.ControlPlane)
	}

	ctx, cancel := context.WithCancel(context.Background())
	states := &bootState{}
	m := &Machine{
		opts:       opts,
		log:        logger.With("node", opts.Name),
		cosi:       state.WrapCore(states),
		states:     states,
		nodeID:     newNodeID(),
		services:   newServices(opts.ControlPlane),
		persistent: cfg,
		subs:       map[uint64]chan struct{}{},
		ctx:        ctx,
		cancel:     cancel,
		st: State{
			TalosVersion:  opts.TalosVersion,
			Config:        cfg,
			ConfigVersion: 1,
			StaticPods:    map[string]StaticPod{},
			Extensions:    opts.Extensions,
		},
	}
	opts.Discovery.join(m)
	if m.faults().PoweredOff {
		// Off from the start: no boot, so no boot ID, services, Node or
		// affiliate; an empty state until the first boot.
		st, err := newBootState(ctx, talosMinor(opts.TalosVersion))
		if err != nil {
			cancel()
			return nil, fmt.Errorf("machine %s: %w", opts.Name, err)
		}
		m.states.set(st)
		m.poweredOff = true
		m.log.Info("powered off (fault): boots once the fault is cleared")
	} else if err := m.boot(ctx); err != nil {
		cancel()
		return nil, fmt.Errorf("machine %s: boot: %w", opts.Name, err)
	}
	m.wg.Add(2)
	go func() {
		defer m.wg.Done()
		m.refreshStaticPodStatuses()
	}()
	go func() {
		defer m.wg.Done()
		m.followPower()
	}()
	return m, nil
}

// PoweredOff tells whether the machine is down under the poweredOff fault (lost
// its power, or never switched on).
func (m *Machine) PoweredOff() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.poweredOff
}

// followPower follows the poweredOff fault until the machine is closed: set
// on a running machine, it loses power (everything down at once, no drain);
// cleared, the machine boots, as when it is switched on. A control plane's
// first boot makes it join the cluster: its etcd member is added (see
// EtcdMember), it publishes itself to the discovery service and its kubelet
// registers its Node, all from its own machine config.
func (m *Machine) followPower() {
	tick := time.NewTicker(faultPollInterval)
	defer tick.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-tick.C:
		}
		off := m.faults().PoweredOff
		m.opMu.Lock()
		m.mu.Lock()
		up, rebooting, poweredOff := m.st.Up, m.rebooting, m.poweredOff
		m.mu.Unlock()
		switch {
		case off && up && !rebooting:
			m.log.Info("power lost (fault)")
			// Down before its services stop: a machine without power stops at
			// once, and its kubelet sees no service stopping first (it would
			// post the Node NotReady, which a powerless kubelet cannot).
			m.mu.Lock()
			m.st.Up, m.poweredOff = false, true
			m.kubelet = KubeletView{}
			m.mu.Unlock()
			if err := m.stopServices(m.ctx); err != nil {
				m.log.Error("power off", "err", err)
			}
			m.endBootEvents()
			m.notify()
		case !off && poweredOff:
			m.log.Info("powered on")
			m.mu.Lock()
			m.poweredOff = false
			m.mu.Unlock()
			m.bootNext(m.ctx)
		}
		m.opMu.Unlock()
	}
}

// EtcdMember tells whether the machine is a member of the cluster's etcd: a
// control plane that has booted at least once. Like Talos' etcd service, a
// control plane's first boot adds its member to the running cluster; the
// member stays listed while the machine is down.
func (m *Machine) EtcdMember() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.opts.ControlPlane && m.joined
}

// Close stops the machine's background work (pending reboots, kubelet
// restarts). The machine keeps its state.
func (m *Machine) Close() {
	m.cancel()
	m.wg.Wait()
}

// Name is the machine's hostname and Kubernetes node name.
func (m *Machine) Name() string { return m.opts.Name }

// IP is the machine's own address.
func (m *Machine) IP() netip.Addr { return m.opts.IP }

// ControlPlane tells whether the machine is a control-plane node.
func (m *Machine) ControlPlane() bool { return m.opts.ControlPlane }

// COSI is the in-memory COSI state holding the machine's Talos resources,
// those of its current boot: like machined, the machine starts every boot
// from an empty state (registered namespaces and resource definitions
// only) and renders its resources anew, their versions from 1. Readers may
// Get/List/Watch it directly; only the machine writes it.
func (m *Machine) COSI() state.State { return m.cosi }

// AdminKubeconfig is the kubeconfig the Kubeconfig call returns.
func (m *Machine) AdminKubeconfig() []byte { return m.opts.AdminKubeconfig }

// State returns a consistent snapshot of the machine.
func (m *Machine) State() State {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.st
	s.StaticPods = make(map[string]StaticPod, len(m.st.StaticPods))
	for k, v := range m.st.StaticPods {
		s.StaticPods[k] = v
	}
	return s
}

// Reachable tells whether the machine's Talos API accepts connections: the
// machine is up, not faulted unreachable, and not inside an
// unreachableAfterApply window.
func (m *Machine) Reachable() bool {
	m.mu.Lock()
	up, until := m.st.Up, m.unreachableUntil
	m.mu.Unlock()
	if !up || time.Now().Before(until) {
		return false
	}
	return !m.faults().Unreachable
}

// Subscribe returns a channel that receives a (coalesced) notification on
// every state change: config applied, reboot begun or ended, version
// changed, API reachability window opened. cancel releases it.
func (m *Machine) Subscribe() (ch <-chan struct{}, cancel func()) {
	c := make(chan struct{}, 1)
	m.mu.Lock()
	id := m.nextSub
	m.nextSub++
	m.subs[id] = c
	m.mu.Unlock()
	return c, func() {
		m.mu.Lock()
		delete(m.subs, id)
		m.mu.Unlock()
	}
}

func (m *Machine) notify() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.subs {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

func (m *Machine) faults() faults.Node { return m.opts.Faults.For(m.opts.Name) }

// Faults returns the machine's current faults (for the API's own).
func (m *Machine) Faults() faults.Node { return m.faults() }

// errDown is what a call to a machine that is rebooting gets.
func (m *Machine) errDown() error {
	return status.Errorf(codes.Unavailable, "node %s is not reachable: rebooting", m.opts.Name)
}

func (m *Machine) isUp() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.Up
}

// boot brings the machine up with a new boot ID, as Talos boots: an empty
// COSI state for the running version, the stage booting, the resources
// rendered from the active config, the services started; then the API
// answers, the machine publishes itself to the discovery service and its
// stage is running (ready once its readiness checks pass). It records the
// start of Talos at the running version.
func (m *Machine) boot(ctx context.Context) error {
	m.mu.Lock()
	version, active, persistent, exts := m.st.TalosVersion, m.st.Config, m.persistent, m.st.Extensions
	m.st.BootID = newUUID()
	m.kubelet = KubeletView{}
	m.machinedLog = nil
	m.lastStatus = nil
	m.mu.Unlock()
	// machined's own sequences, under no actor: initialize, then boot,
	// which ends once the machine runs.
	m.newBootEvents()
	sequenceEvents{m: m, name: "initialize"}.start()
	m.publish("", &machineapi.SequenceEvent{Sequence: "initialize", Action: machineapi.SequenceEvent_STOP})
	sequenceEvents{m: m, name: "boot"}.start()
	defer m.publish("", &machineapi.SequenceEvent{Sequence: "boot", Action: machineapi.SequenceEvent_STOP})
	m.logMachined("machined logger initialized")
	st, err := newBootState(ctx, talosMinor(version))
	if err != nil {
		return err
	}
	m.states.set(st)
	m.setStage(ctx, runtime.MachineStageBooting)
	if err := safe.StateModify(ctx, m.cosi, runtime.NewVersion(), func(r *runtime.Version) error {
		r.TypedSpec().Name = "Talos"
		r.TypedSpec().Version = version
		return nil
	}); err != nil {
		return fmt.Errorf("version: %w", err)
	}
	if err := m.publishExtensions(ctx, version, exts); err != nil {
		return err
	}
	if err := m.syncConfig(ctx, active, persistent); err != nil {
		return fmt.Errorf("render resources: %w", err)
	}
	if err := m.startServices(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	m.st.Up, m.joined = true, true
	m.mu.Unlock()
	if err := m.publishAffiliate(ctx); err != nil {
		return err
	}
	m.refreshMembers(ctx)
	m.setStage(ctx, runtime.MachineStageRunning)
	m.opts.Events.Start(m.opts.Name, events.Talos, version)
	m.log.Info("booted", "version", version)
	m.notify()
	return nil
}

// talosMinor returns the minor of a Talos version ("v1.13.9": 13).
func talosMinor(version string) int {
	var major, minor int
	if _, err := fmt.Sscanf(version, "v%d.%d", &major, &minor); err != nil || major != 1 {
		return 0
	}
	return minor
}

// Version returns the running Talos version (Unavailable while down).
func (m *Machine) Version() (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.st.Up {
		return "", m.errDown()
	}
	return m.st.TalosVersion, nil
}

// ReadFile returns the content of a file on the machine as the Read call
// serves it. Only /proc/sys/kernel/random/boot_id (how talosctl reads the
// boot ID) and /proc/sys/kernel/hostname exist.
func (m *Machine) ReadFile(path string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.st.Up {
		return nil, m.errDown()
	}
	switch path {
	case "/proc/sys/kernel/random/boot_id":
		return []byte(m.st.BootID + "\n"), nil
	case "/proc/sys/kernel/hostname":
		return []byte(m.opts.Name + "\n"), nil
	default:
		return nil, status.Errorf(codes.NotFound, "open %s: no such file or directory", path)
	}
}

// Kubeconfig returns the admin kubeconfig; like Talos, only control planes
// hold it.
func (m *Machine) Kubeconfig() ([]byte, error) {
	if !m.isUp() {
		return nil, m.errDown()
	}
	if !m.opts.ControlPlane {
		return nil, status.Error(codes.FailedPrecondition, "kubeconfig is only available on control plane nodes")
	}
	if len(m.opts.AdminKubeconfig) == 0 {
		return nil, status.Error(codes.NotFound, "admin kubeconfig is not available")
	}
	return m.opts.AdminKubeconfig, nil
}

// newUUID returns a random (version 4) UUID, as Linux writes a boot ID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
