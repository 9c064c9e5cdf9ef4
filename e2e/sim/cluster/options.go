package cluster

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"
	"github.com/siderolabs/talos/pkg/machinery/config"

	simmachine "github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// Options describe a local cluster.
type Options struct {
	// Dir holds everything of the cluster: kubeconfig, talosconfig,
	// events.jsonl, logs/, and the state of its processes.
	Dir string
	// Name is the cluster's name (default "ichor-sim").
	Name string
	// ControlPlanes and Workers count the simulated Talos machines.
	ControlPlanes, Workers int
	// KubernetesVersion is the version every component starts at (vX.Y.Z).
	KubernetesVersion string
	// TalosVersion is the Talos version every machine runs (vA.B.C).
	TalosVersion string
	// BornOn is the Talos version the cluster was bootstrapped on (vA.B.C, no newer
	// than TalosVersion; "" is TalosVersion): its bootstrap manifest objects are created
	// as that version created them (a plain Create before 1.13, server-side apply with
	// the inventory from 1.13), then kept by TalosVersion's controller as it keeps those
	// of an upgraded cluster, and its machine configs are those that version generates.
	BornOn string
	// BinDir holds etcd, kube-apiserver, kube-controller-manager and
	// kube-scheduler (make cluster-bins).
	BinDir string
	// FaultsFile is the faults file (see package faults); it may be written
	// or changed while the cluster runs.
	FaultsFile string
	// ConfigLayout is how the machine configs keep the Kubernetes settings
	// (see ConfigLayouts); "" is the layout `talosctl gen config` of
	// TalosVersion writes.
	ConfigLayout string
	// TalosAPIAccess enables the Talos API access from Kubernetes on the
	// control planes for the ichor-system namespace with role os:admin
	// (machine.features.kubernetesTalosAPIAccess, or a
	// KubeTalosAPIAccessConfig document on a multi-doc config).
	TalosAPIAccess bool
	// Images maps an image repository to a local directory that stands for
	// that image's root filesystem: the containers of a pod whose image is in
	// this map run as local processes (see package kubelet).
	Images map[string]string
	// Extensions are, by node name, the system extensions ("name" or
	// "name@version") a machine was installed with.
	Extensions map[string][]string
	// BootLoaders are, by node name, the boot loader a machine booted with:
	// BootLoaderGRUB (the default) or BootLoaderSystemdBoot (a UKI, as UEFI installs
	// from Talos 1.10 and SecureBoot ones boot), as its SecurityState says.
	BootLoaders map[string]string
	// KernelArgs are, by node name, the machine's machine.install.extraKernelArgs
	// (with machine.install.grubUseUKICmdline false, which Talos requires with them).
	KernelArgs map[string][]string
	// Schematics are, by node name, the Image Factory schematic ID a machine
	// was installed from (its virtual "schematic" extension, built by
	// https://factory.talos.dev).
	Schematics map[string]string
	// InlineManifests are the control planes' cluster.inlineManifests: Talos
	// renders each as bootstrap manifest "99-<name>" and creates its objects
	// when the cluster bootstraps.
	InlineManifests []InlineManifest
	// ExtraManifests are the control planes' cluster.extraManifests: URLs
	// (http or https) Talos fetches each as bootstrap manifest "99-<url>".
	ExtraManifests []string
	// Mirror, when not empty, runs a private registry of the cluster (see
	// machine.Mirror) on the control plane's address, port MirrorPort, holding
	// these Kubernetes releases (vX.Y.Z; KubernetesVersion is added), and puts
	// the machine configs' Kubernetes images on it.
	Mirror []string
	// Latency is how long simulated things take.
	Latency Latency
}

// MirrorPort is the port of the cluster's mirror (Options.Mirror).
const MirrorPort = 5000

// InlineManifest is one of cluster.inlineManifests.
type InlineManifest struct {
	// Name names the manifest (its Manifest resource is "99-<name>").
	Name string
	// Contents is its multi-document YAML.
	Contents string
}

// Latency holds the simulated durations.
type Latency struct {
	// StaticPodRestart is how long a control-plane static pod takes from an
	// applied config to running on its new image.
	StaticPodRestart time.Duration
	// Ready is how long a started container takes to pass readiness, and a
	// booted node to turn Ready after its kubelet starts.
	Ready time.Duration
	// KubeletRestart is how long the node stays NotReady when its kubelet
	// restarts on a new image.
	KubeletRestart time.Duration
	// PodStart is how long a pod takes from bound to running.
	PodStart time.Duration
	// ImagePull is how long a Talos image pull takes.
	ImagePull time.Duration
	// Reboot is how long a Talos machine is down for a reboot.
	Reboot time.Duration
	// ManifestRender is how long after a config change a control plane re-renders its
	// bootstrap manifests (Talos' controllers do it asynchronously); 0 is the
	// machine's default, machine.DefaultManifestRenderDelay.
	ManifestRender time.Duration
}

// DefaultLatency is what a local cluster uses unless told otherwise: short
// enough for tests, long enough that ordering is visible.
func DefaultLatency() Latency {
	return Latency{
		StaticPodRestart: 2 * time.Second,
		Ready:            1 * time.Second,
		KubeletRestart:   2 * time.Second,
		PodStart:         300 * time.Millisecond,
		ImagePull:        200 * time.Millisecond,
		Reboot:           3 * time.Second,
		ManifestRender:   simmachine.DefaultManifestRenderDelay,
	}
}

var semverRE = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

// Validate checks the options and fills defaults. Its errors say what to do.
func (o *Options) Validate() error {
	if o.Dir == "" {
		return errors.New("--dir is required: the directory that will hold the cluster's kubeconfig, talosconfig and logs")
	}
	abs, err := filepath.Abs(o.Dir)
	if err != nil {
		return fmt.Errorf("--dir %q: %w", o.Dir, err)
	}
	o.Dir = abs
	if o.Name == "" {
		o.Name = "ichor-sim"
	}
	if o.ControlPlanes < 1 {
		return fmt.Errorf("--control-planes %d: a cluster needs at least 1 control plane", o.ControlPlanes)
	}
	if o.Workers < 0 {
		return fmt.Errorf("--workers %d: cannot be negative", o.Workers)
	}
	if o.ControlPlanes+o.Workers > maxMachines {
		return fmt.Errorf("%d machines: at most %d fit in one local cluster", o.ControlPlanes+o.Workers, maxMachines)
	}
	if err := checkOpenFiles(o.ControlPlanes+o.Workers, openFilesLimit()); err != nil {
		return err
	}
	if !semverRE.MatchString(o.KubernetesVersion) {
		return fmt.Errorf("--kubernetes %q: want a version like v1.35.4", o.KubernetesVersion)
	}
	if !semverRE.MatchString(o.TalosVersion) {
		return fmt.Errorf("--talos %q: want a version like v1.12.4", o.TalosVersion)
	}
	talos, err := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: o.TalosVersion})
	if err != nil {
		return fmt.Errorf("--talos %s: %w", o.TalosVersion, err)
	}
	if err := o.validateBornOn(); err != nil {
		return err
	}
	k8s, err := compatibility.ParseKubernetesVersion(strings.TrimPrefix(o.KubernetesVersion, "v"))
	if err != nil {
		return fmt.Errorf("--kubernetes %s: %w", o.KubernetesVersion, err)
	}
	if err := k8s.SupportedWith(talos); err != nil {
		return fmt.Errorf("--kubernetes %s with --talos %s: %w (pick a pair that Talos supports)", o.KubernetesVersion, o.TalosVersion, err)
	}
	contract, err := config.ParseContractFromVersion(o.TalosVersion)
	if err != nil {
		return fmt.Errorf("--talos %s: %w", o.TalosVersion, err)
	}
	born, err := config.ParseContractFromVersion(o.BornOn)
	if err != nil {
		return fmt.Errorf("--born-on %s: %w", o.BornOn, err)
	}
	switch o.ConfigLayout {
	case "":
		// As talosctl gen config of the version the cluster was born on writes them.
		o.ConfigLayout = LayoutV1Alpha1
		if born.MultidocKubernetesConfigSupported() {
			o.ConfigLayout = LayoutMultiDoc
		}
	case LayoutV1Alpha1:
	case LayoutMultiDoc, LayoutMixed:
		if !contract.MultidocKubernetesConfigSupported() {
			return fmt.Errorf("--config-layout %s needs Talos 1.14 or later (--talos %s keeps every setting in v1alpha1)", o.ConfigLayout, o.TalosVersion)
		}
	default:
		return fmt.Errorf("--config-layout %q: want one of %s", o.ConfigLayout, strings.Join(ConfigLayouts(), ", "))
	}
	if o.BinDir == "" {
		return errors.New("--bin-dir is required: the directory with etcd and the kube-* binaries (make cluster-bins)")
	}
	if err := o.validateExtensions(); err != nil {
		return err
	}
	if err := o.validateManifests(); err != nil {
		return err
	}
	for _, r := range o.Mirror {
		if !semverRE.MatchString(r) {
			return fmt.Errorf("--mirror %q: want Kubernetes releases like v1.35.4, comma-separated", r)
		}
	}
	if len(o.Mirror) > 0 && !slices.Contains(o.Mirror, o.KubernetesVersion) {
		o.Mirror = append(o.Mirror, o.KubernetesVersion)
	}
	if o.Latency == (Latency{}) {
		o.Latency = DefaultLatency()
	}
	return nil
}

// The config layouts a local cluster can be generated with.
const (
	// LayoutV1Alpha1: every Kubernetes setting in the v1alpha1 document, as
	// Talos 1.13 and older generate, and as a node upgraded from them keeps.
	LayoutV1Alpha1 = "v1alpha1"
	// LayoutMultiDoc: each component in its own document (KubeletConfig,
	// KubeAPIServerConfig, ...), as Talos 1.14 generates.
	LayoutMultiDoc = "multi-doc"
	// LayoutMixed: a cluster grown across the 1.14 upgrade. Machine i
	// (from 0) keeps the v1alpha1 layout when i%3 == 0 (upgraded from 1.13),
	// the multi-doc one when i%3 == 1 (generated on 1.14), and when i%3 == 2
	// the kubelet and kube-apiserver in v1alpha1 with the rest in documents.
	LayoutMixed = "mixed"
)

// ConfigLayouts lists the layouts, for help texts.
func ConfigLayouts() []string { return []string{LayoutV1Alpha1, LayoutMultiDoc, LayoutMixed} }

// A cluster's loopback addresses come in blocks of blockAddrs (a /20,
// 127.a.b.0/20), numBlocks of them from 127.10.0.0 on.
const (
	blockAddrs = 4096
	numBlocks  = 240 * 16
)

// maxMachines is what 16 consecutive blocks hold. A machine's own limits
// come first: its open files (checkOpenFiles) and memory.
const maxMachines = 16*blockAddrs - 10

// The open files a cluster's daemon needs: two listeners per simulated
// machine (its Talos API and its kubelet's), and a spare for the rest (the
// control plane's clients, the connections it accepts, logs).
const (
	openFilesPerMachine = 2
	openFilesSpare      = 1024
)

// checkOpenFiles refuses a cluster whose listeners do not fit under limit,
// the process's RLIMIT_NOFILE (which Go raises to the hard limit at start).
func checkOpenFiles(machines int, limit uint64) error {
	need := uint64(machines*openFilesPerMachine + openFilesSpare)
	if need > limit {
		return fmt.Errorf("%d machines need about %d open files (a Talos API and a kubelet listener each), and this process may open %d: raise the hard limit (ulimit -Hn) or start fewer machines",
			machines, need, limit)
	}
	return nil
}

// openFilesLimit is the process's limit of open files.
func openFilesLimit() uint64 {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return math.MaxUint64 // not known: let the listeners say
	}
	return l.Cur
}

// addressPlan places a cluster on its own loopback addresses: the control
// plane on the first block's .1 and machine i on base+10+i, running on into
// as many consecutive blocks as the machines need, so every machine has an
// address of its own, as in a real cluster, and several clusters can run side
// by side.
type addressPlan struct {
	base netip.Addr
}

// blocksFor is how many blocks a cluster of n machines spans.
func blocksFor(machines int) int {
	return (10 + machines + blockAddrs - 1) / blockAddrs
}

func (p addressPlan) apiServer() netip.Addr { return p.offset(1) }

func (p addressPlan) machine(i int) netip.Addr { return p.offset(10 + i) }

func (p addressPlan) offset(n int) netip.Addr {
	b := p.base.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// pickAddresses chooses free blocks for a cluster of n machines, starting
// from one derived from dir so a cluster tends to keep its addresses across
// restarts. A block is taken when its control plane's address serves 6443 or
// when its first machine address (the block's base+10) serves 50000: each of
// the blocks a cluster spans must be free of the second (another cluster's
// machines), and the first of the first too.
func pickAddresses(dir string, machines int) (addressPlan, error) {
	span := blocksFor(machines)
	h := fnv.New32a()
	_, _ = h.Write([]byte(dir))
	start := int(h.Sum32() % numBlocks)
	for i := range numBlocks {
		n := (start + i) % numBlocks
		if n+span > numBlocks {
			continue
		}
		p := addressPlan{base: netip.AddrFrom4([4]byte{127, byte(10 + n/16), byte((n % 16) * 16), 0})}
		ok := free(p.apiServer(), 6443)
		for k := 0; ok && k < span; k++ {
			ok = free(p.offset(k*blockAddrs+10), 50000)
		}
		if ok {
			return p, nil
		}
	}
	return addressPlan{}, fmt.Errorf("no %d free loopback address block(s) in a row for %d machines: stop other local clusters (ichor-sim down)", span, machines)
}

func free(addr netip.Addr, port int) bool {
	l, err := net.Listen("tcp", netip.AddrPortFrom(addr, uint16(port)).String())
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// validateBornOn checks --born-on and fills its default, --talos.
func (o *Options) validateBornOn() error {
	if o.BornOn == "" {
		o.BornOn = o.TalosVersion
		return nil
	}
	if !semverRE.MatchString(o.BornOn) {
		return fmt.Errorf("--born-on %q: want a Talos version like v1.12.4", o.BornOn)
	}
	if versionLess(o.TalosVersion, o.BornOn) {
		return fmt.Errorf("--born-on %s is newer than --talos %s: a cluster runs the version it was born on or a later one", o.BornOn, o.TalosVersion)
	}
	return nil
}

// versionLess reports whether vA.B.C version a is older than b.
func versionLess(a, b string) bool {
	var x, y [3]int
	_, _ = fmt.Sscanf(a, "v%d.%d.%d", &x[0], &x[1], &x[2])
	_, _ = fmt.Sscanf(b, "v%d.%d.%d", &y[0], &y[1], &y[2])
	for i := range x {
		if x[i] != y[i] {
			return x[i] < y[i]
		}
	}
	return false
}

// The boot loaders a machine can boot with (BootLoaders).
const (
	BootLoaderGRUB        = "grub"
	BootLoaderSystemdBoot = "sd-boot"
)

// machineNames are the names of the cluster's machines.
func (o *Options) machineNames() map[string]bool {
	known := map[string]bool{}
	for i := range o.ControlPlanes + o.Workers {
		known[MachineName(i, o.ControlPlanes)] = true
	}
	return known
}

// MachineName is the name of a cluster's machine i (from 0), its first
// controlPlanes machines control planes: cp-1, cp-2, ..., then worker-1, ...
func MachineName(i, controlPlanes int) string {
	if i < controlPlanes {
		return fmt.Sprintf("cp-%d", i+1)
	}
	return fmt.Sprintf("worker-%d", i-controlPlanes+1)
}

// validateExtensions checks --extensions, --schematic, --boot-loader and --kernel-args
// name machines of the cluster, real-looking schematic IDs and known boot loaders.
func (o *Options) validateExtensions() error {
	known := o.machineNames()
	for node, bl := range o.BootLoaders {
		if !known[node] {
			return fmt.Errorf("--boot-loader %s=...: no machine %s in this cluster (cp-1.., worker-1..)", node, node)
		}
		if bl != BootLoaderGRUB && bl != BootLoaderSystemdBoot {
			return fmt.Errorf("--boot-loader %s=%s: want %s or %s", node, bl, BootLoaderGRUB, BootLoaderSystemdBoot)
		}
	}
	for node := range o.KernelArgs {
		if !known[node] {
			return fmt.Errorf("--kernel-args %s=...: no machine %s in this cluster (cp-1.., worker-1..)", node, node)
		}
	}
	for node := range o.Extensions {
		if !known[node] {
			return fmt.Errorf("--extensions %s=...: no machine %s in this cluster (cp-1.., worker-1..)", node, node)
		}
	}
	for node, id := range o.Schematics {
		if !known[node] {
			return fmt.Errorf("--schematic %s=...: no machine %s in this cluster (cp-1.., worker-1..)", node, node)
		}
		if !schematicIDRE.MatchString(id) {
			return fmt.Errorf("--schematic %s=%s: want a schematic ID (64 hex digits, the SHA-256 Image Factory names it by)", node, id)
		}
	}
	return nil
}

var schematicIDRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// machineExtensions are the extensions a machine boots with: its
// --extensions (by Sidero Labs, version v1.0.0 unless given), then the
// virtual schematic extension of its --schematic.
func (o *Options) machineExtensions(node string) []simmachine.Extension {
	var out []simmachine.Extension
	for _, e := range o.Extensions[node] {
		name, version, ok := strings.Cut(e, "@")
		if !ok {
			version = "v1.0.0"
		}
		out = append(out, simmachine.Extension{Name: name, Version: version, Author: "Sidero Labs"})
	}
	if id := o.Schematics[node]; id != "" {
		out = append(out, simmachine.Extension{Name: simmachine.SchematicExtensionName, Version: id, Author: "Image Factory (https://factory.talos.dev)"})
	}
	return out
}

// validateManifests checks --inline-manifest names (one each, as Talos
// requires) and --extra-manifest URLs.
func (o *Options) validateManifests() error {
	seen := map[string]bool{}
	for _, m := range o.InlineManifests {
		if m.Name == "" || seen[m.Name] {
			return fmt.Errorf("--inline-manifest %q: give each inline manifest a name of its own (NAME=FILE)", m.Name)
		}
		seen[m.Name] = true
	}
	for _, u := range o.ExtraManifests {
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return fmt.Errorf("--extra-manifest %q: want an http or https URL, as Talos fetches", u)
		}
	}
	return nil
}
