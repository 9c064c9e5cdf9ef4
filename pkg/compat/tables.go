package compat

import (
	"fmt"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"
	"github.com/siderolabs/talos/pkg/machinery/gendata"
)

// probeMinors bounds the minors probed to find what machinery's tables know: its
// tables are reached only through its functions, one minor at a time.
const probeMinors = 100

// Range is the Kubernetes minors a Talos minor supports, 1.Lo to 1.Hi.
type Range struct {
	// Lo is the oldest Kubernetes minor supported.
	Lo uint64
	// Hi is the newest Kubernetes minor supported.
	Hi uint64
}

// String returns "1.Lo-1.Hi".
func (r Range) String() string { return fmt.Sprintf("1.%d-1.%d", r.Lo, r.Hi) }

// Contains reports whether Kubernetes v's minor is in the range.
func (r Range) Contains(v Version) bool { return v.Major == 1 && v.Minor >= r.Lo && v.Minor <= r.Hi }

// UnknownTalosError is a Talos minor machinery's tables do not know: one newer than this
// build (upgrade kubectl-ichor) or older than its tables reach.
type UnknownTalosError struct {
	// Version is the Talos version.
	Version Version
	// Where names the nodes that run it, " (on cp-1)", or "" for a target.
	Where string
}

// Error implements error.
func (e *UnknownTalosError) Error() string {
	oldest, newest := talosTableEnds()
	if e.Version.Compare(oldest) < 0 {
		return fmt.Sprintf("Talos %s%s is older than this build knows (Talos %s to %s)", e.Version.MinorString(), e.Where, oldest.MinorString(), newest.MinorString())
	}

	return fmt.Sprintf("Talos %s%s is newer than this build knows (Talos up to %s)", e.Version.MinorString(), e.Where, newest.MinorString())
}

// Action says what to do about it.
func (e *UnknownTalosError) Action() string {
	if oldest, _ := talosTableEnds(); e.Version.Compare(oldest) < 0 {
		return fmt.Sprintf("upgrade Talos to %s or newer with talosctl first", oldest.MinorString())
	}

	return "upgrade kubectl-ichor to a release that knows it (kubectl krew upgrade ichor)"
}

// machineryTalos is v as machinery's compatibility package takes it; a vX.Y.Z always
// parses.
func machineryTalos(v Version) *compatibility.TalosVersion {
	tv, err := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: v.String()})
	if err != nil {
		panic(fmt.Sprintf("machinery refuses %s: %v", v, err))
	}

	return tv
}

// machineryKubernetes is v as machinery's compatibility package takes it.
func machineryKubernetes(v Version) *compatibility.KubernetesVersion {
	kv, err := compatibility.ParseKubernetesVersion(v.String())
	if err != nil {
		panic(fmt.Sprintf("machinery refuses %s: %v", v, err))
	}

	return kv
}

// kubernetesRange returns the Kubernetes minors machinery says Talos talos supports; ok
// is false when machinery does not know talos's minor at all.
func kubernetesRange(talos Version) (r Range, ok bool) {
	tv := machineryTalos(talos)

	for m := uint64(0); m < probeMinors; m++ {
		if machineryKubernetes(Version{Major: 1, Minor: m}).SupportedWith(tv) == nil {
			if !ok {
				r.Lo, ok = m, true
			}

			r.Hi = m
		}
	}

	return r, ok
}

// KubernetesRange returns the Kubernetes minors Talos talos supports, per machinery's
// tables; an *UnknownTalosError for a Talos minor they do not know.
func KubernetesRange(talos Version) (Range, error) {
	r, ok := kubernetesRange(talos)
	if !ok {
		return Range{}, &UnknownTalosError{Version: talos}
	}

	return r, nil
}

// TalosMinors lists the Talos minors machinery's tables know, oldest first, as vX.Y.0.
func TalosMinors() []Version {
	var out []Version

	for m := uint64(0); m < probeMinors; m++ {
		v := Version{Major: 1, Minor: m}
		if _, ok := kubernetesRange(v); ok {
			out = append(out, v)
		}
	}

	return out
}

// talosTableEnds are the oldest and newest Talos minors machinery knows.
func talosTableEnds() (oldest, newest Version) {
	known := TalosMinors()
	if len(known) == 0 {
		return Version{}, Version{}
	}

	return known[0], known[len(known)-1]
}

// NewestTalos is the newest Talos minor machinery's tables know, as vX.Y.0.
func NewestTalos() Version {
	_, newest := talosTableEnds()

	return newest
}

// BuildTalos is the Talos release this build's machinery is, e.g. v1.14.1: the only
// Talos patch release the build knows by itself.
func BuildTalos() (Version, bool) {
	v, err := ParseVersion(gendata.VersionTag)

	return v, err == nil
}

// KnownTalos returns an *UnknownTalosError when machinery's tables do not know talos's
// minor.
func KnownTalos(talos Version) error {
	_, err := KubernetesRange(talos)

	return err
}

// Supports says whether Talos talos supports Kubernetes kubernetes, per machinery's
// tables (Kubernetes SupportedWith Talos). A Talos minor they do not know is an
// *UnknownTalosError.
func Supports(talos, kubernetes Version) error {
	r, err := KubernetesRange(talos)
	if err != nil {
		return err
	}

	if err := machineryKubernetes(kubernetes).SupportedWith(machineryTalos(talos)); err != nil {
		if !r.Contains(kubernetes) {
			return fmt.Errorf("Talos %s supports Kubernetes %s, not %s", talos, r, kubernetes) //nolint:staticcheck // ST1005: Talos is a name
		}

		// Within the range's minors but refused (a patch past the table's bound).
		return err
	}

	return nil
}

// Upgradeable says whether a node running Talos from may be upgraded to Talos to: not a
// downgrade, a target minor machinery knows (else an *UnknownTalosError), and allowed
// by machinery's upgrade table (TalosVersion.UpgradeableFrom).
func Upgradeable(from, to Version) error {
	if to.Compare(from) < 0 {
		return fmt.Errorf("%s is older than the running %s: downgrades are not supported", to, from)
	}

	if err := KnownTalos(to); err != nil {
		return err
	}

	return machineryTalos(to).UpgradeableFrom(machineryTalos(from))
}

// SSAManifestSync reports whether Talos talos syncs the bootstrap manifests with
// server-side apply (machinery's SupportsSSAManifestSync: Talos 1.13 and newer), so
// that the objects it creates carry its inventory.
func SSAManifestSync(talos Version) bool {
	return machineryTalos(talos).SupportsSSAManifestSync()
}

// TalosFor is the oldest Talos minor machinery pairs with Kubernetes kubernetes and that
// is not older than atLeast's minor, as vX.Y.0; false when none does.
func TalosFor(kubernetes, atLeast Version) (Version, bool) {
	floor := Version{Major: atLeast.Major, Minor: atLeast.Minor}

	for _, m := range TalosMinors() {
		if m.Compare(floor) >= 0 && Supports(m, kubernetes) == nil {
			return m, true
		}
	}

	return Version{}, false
}

// releaseOf names a release of Talos minor m to pass as a target: this build's own
// release when it is that minor (v1.14.1), else "v1.13.<patch>".
func releaseOf(m Version) string {
	if build, ok := BuildTalos(); ok && build.SameMinor(m) {
		return build.String()
	}

	return fmt.Sprintf("v%s.<patch>", m.MinorString())
}
