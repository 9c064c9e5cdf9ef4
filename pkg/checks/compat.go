package checks

import (
	"fmt"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"
	"github.com/siderolabs/talos/pkg/machinery/gendata"

	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// probeMinors bounds the minors probed to find what machinery's tables know.
const probeMinors = 100

// talosVersion parses a Talos version for machinery's compatibility package.
func talosVersion(v stages.Version) (*compatibility.TalosVersion, error) {
	return compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: v.String()})
}

// kubernetesRange returns the Kubernetes minors (1.lo to 1.hi) machinery says Talos
// version tv supports; ok is false when machinery does not know tv's minor at all.
func kubernetesRange(tv *compatibility.TalosVersion) (lo, hi uint64, ok bool) {
	for m := uint64(0); m < probeMinors; m++ {
		kv, err := compatibility.ParseKubernetesVersion(fmt.Sprintf("1.%d.0", m))
		if err != nil {
			continue
		}

		if kv.SupportedWith(tv) == nil {
			if !ok {
				lo, ok = m, true
			}

			hi = m
		}
	}

	return lo, hi, ok
}

// newestKnownTalos is the newest Talos minor machinery's tables know, e.g. "1.13".
func newestKnownTalos() string {
	newest := "none"

	for m := uint64(0); m < probeMinors; m++ {
		tv, err := talosVersion(stages.Version{Major: 1, Minor: m})
		if err != nil {
			continue
		}

		if _, _, ok := kubernetesRange(tv); ok {
			newest = fmt.Sprintf("1.%d", m)
		}
	}

	return newest
}

// talosFor says which Talos to upgrade to first for Kubernetes kv: the
// oldest Talos minor machinery's tables pair with it, named by this build's
// machinery release when it is that minor.
func talosFor(kv *compatibility.KubernetesVersion) string {
	for m := uint64(0); m < probeMinors; m++ {
		tv, err := talosVersion(stages.Version{Major: 1, Minor: m})
		if err != nil || kv.SupportedWith(tv) != nil {
			continue
		}

		target := fmt.Sprintf("v1.%d.<patch>", m)
		if known, err := stages.ParseVersion(gendata.VersionTag); err == nil && known.Major == 1 && known.Minor == m {
			target = known.String()
		}

		return fmt.Sprintf("upgrade Talos to 1.%d first: kubectl ichor upgrade talos --to %s", m, target)
	}

	return "no Talos release this build knows supports it: upgrade kubectl-ichor (kubectl krew upgrade ichor), " +
		"or pick another --to"
}

// unknownTalos is the refusal for a Talos minor this build does not know.
func unknownTalos(v stages.Version, where string) (string, string) {
	return fmt.Sprintf("Talos %s%s is newer than this build knows (Talos up to %s)", v.MinorString(), where, newestKnownTalos()),
		"upgrade kubectl-ichor to a release that knows it (kubectl krew upgrade ichor)"
}
