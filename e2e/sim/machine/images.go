package machine

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/blang/semver/v4"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"
	"github.com/siderolabs/talos/pkg/machinery/gendata"
	"github.com/siderolabs/talos/pkg/machinery/version"
)

// The images a machine can pull are those the registries it reaches serve.
// The simulator knows the public ones an upgrade meets, as they are today:
//
//   - ghcr.io/siderolabs/installer, the generic installer, for Talos tags
//     below v1.14.0 only: Talos 1.14 stopped publishing it (talos#13138;
//     ghcr.io/siderolabs/installer:v1.14.0 is "manifest unknown"). A mirror
//     of it (another registry, the same path siderolabs/installer) holds
//     what it could copy, the same tags.
//   - factory.talos.dev, the Image Factory: <factory>/installer/<schematic>
//     and <factory>/<platform>-installer[-secureboot]/<schematic> for every
//     schematic ID and every Talos version machinery knows.
//   - registry.k8s.io's kube-apiserver, kube-controller-manager,
//     kube-scheduler and kube-proxy, and ghcr.io/siderolabs/kubelet, for
//     every Kubernetes version machinery knows.
//
// The Image Factory serves nothing else. A cluster's private mirror
// (Mirror) serves the Kubernetes releases it holds and nothing else. Any
// other repository (the pause image, another private registry, another
// owner's) is served as asked: the simulator does not know its tags. The faults file's unpublished list
// takes any reference away on top (faults.File).
//
// A pull that finds nothing fails as containerd's resolver makes Talos' pull
// fail (internal/pkg/containers/image/pull.go: "failed to pull image %q: %w"
// over containerd's "failed to resolve reference %q: %w" over the resolver's
// "<ref>: not found"); each API wraps that its own way (ImageService and
// MachineService.ImagePull: NotFound "error pulling image: ...";
// MachineService.Upgrade: "error validating installer image %q: ...").

// The public registries, by machinery's names where it has them.
var (
	registryGHCR    = gendata.ImagesRegistry // ghcr.io
	registryFactory = gendata.ImageFactory   // factory.talos.dev
)

const (
	registryK8s       = "registry.k8s.io"
	registryDockerHub = "docker.io"
)

// imageRef is an image reference split as a registry resolves it.
type imageRef struct {
	host, path, tag, digest string
}

// refPart is one path component of a reference (docker's grammar, lower case).
var refPart = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)

// parseImageRef splits ref as containerd's docker reference parser does,
// with its defaults: a name without a registry is Docker Hub's (library/ for
// a single component), a name without tag or digest is tagged latest.
func parseImageRef(ref string) (imageRef, error) {
	var r imageRef
	rest := ref
	if i := strings.Index(rest, "@"); i >= 0 {
		rest, r.digest = rest[:i], rest[i+1:]
		if !strings.HasPrefix(r.digest, "sha256:") || len(r.digest) != len("sha256:")+64 {
			return imageRef{}, fmt.Errorf("failed to parse image reference %q: invalid reference format", ref)
		}
	}
	if i := strings.LastIndex(rest, ":"); i > strings.LastIndex(rest, "/") {
		rest, r.tag = rest[:i], rest[i+1:]
		if r.tag == "" {
			return imageRef{}, fmt.Errorf("failed to parse image reference %q: invalid reference format", ref)
		}
	}
	parts := strings.Split(rest, "/")
	if len(parts) > 1 && (strings.ContainsAny(parts[0], ".:") || parts[0] == "localhost") {
		r.host, parts = parts[0], parts[1:]
	} else {
		r.host = registryDockerHub
		if len(parts) == 1 {
			parts = append([]string{"library"}, parts...)
		}
	}
	for _, p := range parts {
		if !refPart.MatchString(p) {
			return imageRef{}, fmt.Errorf("failed to parse image reference %q: invalid reference format", ref)
		}
	}
	r.path = strings.Join(parts, "/")
	if r.tag == "" && r.digest == "" {
		r.tag = "latest"
	}
	return r, nil
}

// repository is host/path.
func (r imageRef) repository() string { return r.host + "/" + r.path }

// String is the normalized reference, as Talos names what it pulled.
func (r imageRef) String() string {
	s := r.repository()
	if r.tag != "" {
		s += ":" + r.tag
	}
	if r.digest != "" {
		s += "@" + r.digest
	}
	return s
}

// imageNotFoundError is containerd's "not found" for a reference no
// registry serves, as Talos' pull wraps it (see above).
type imageNotFoundError struct{ ref string }

func (e *imageNotFoundError) Error() string {
	return fmt.Sprintf("failed to pull image %q: failed to resolve reference %q: %s: not found", e.ref, e.ref, e.ref)
}

// kubernetesRepositories are the Kubernetes images the simulator knows, by
// repository.
var kubernetesRepositories = []string{
	registryK8s + "/kube-apiserver",
	registryK8s + "/kube-controller-manager",
	registryK8s + "/kube-scheduler",
	registryK8s + "/kube-proxy",
	registryGHCR + "/" + gendata.ImagesUsername + "/kubelet",
}

// installerPath is the generic installer's path on any registry.
var installerPath = gendata.ImagesUsername + "/installer"

// firstWithoutGenericInstaller is the first Talos version whose generic
// installer was not published.
var firstWithoutGenericInstaller = semver.MustParse("1.14.0")

// factoryInstallerName matches the name of an Image Factory installer:
// "installer" or "<platform>-installer", either with "-secureboot".
var factoryInstallerName = regexp.MustCompile(`^([a-z0-9]+-)?installer(-secureboot)?$`)

// schematicID matches an Image Factory schematic ID: the SHA-256 of its
// content.
var schematicID = regexp.MustCompile(`^[0-9a-f]{64}$`)

// published says whether the registries (and mirror, when not nil) serve r
// (nil), or why not.
func published(r imageRef, unpublished []string, mirror *Mirror) error {
	for _, u := range unpublished {
		if ur, err := parseImageRef(u); err == nil && unpublishedMatches(ur, u, r) {
			return &imageNotFoundError{ref: r.String()}
		}
	}
	if mirror != nil && r.host == mirror.Host {
		if !mirror.holds(r) {
			return &imageNotFoundError{ref: r.String()}
		}
		return nil
	}
	if !servedByPublicRegistries(r) {
		return &imageNotFoundError{ref: r.String()}
	}
	return nil
}

// unpublishedMatches reports whether an entry of the unpublished list (ur,
// parsed from raw) takes r away: the same reference, or any tag of its
// repository when the entry names none.
func unpublishedMatches(ur imageRef, raw string, r imageRef) bool {
	if ur.repository() != r.repository() {
		return false
	}
	bare := !strings.Contains(raw[strings.LastIndex(raw, "/")+1:], ":") && ur.digest == ""
	switch {
	case bare:
		return true
	case ur.digest != "":
		return ur.digest == r.digest
	}
	return ur.tag == r.tag
}

// servedByPublicRegistries applies the rules above.
func servedByPublicRegistries(r imageRef) bool {
	repo := r.repository()
	switch {
	case r.path == installerPath || strings.HasSuffix(r.path, "/"+installerPath):
		// The generic installer, or a mirror of it.
		return r.tag == "" || genericInstallerPublished(r.tag)
	case r.host == registryFactory:
		parts := strings.Split(r.path, "/")
		if len(parts) != 2 || !factoryInstallerName.MatchString(parts[0]) || !schematicID.MatchString(parts[1]) {
			return false
		}
		return r.tag == "" || knownTalos(r.tag)
	case slices.Contains(kubernetesRepositories, repo):
		return r.tag == "" || knownKubernetes(r.tag)
	}
	return true
}

// genericInstallerPublished reports whether ghcr.io/siderolabs/installer
// has the tag: a Talos version before 1.14.
func genericInstallerPublished(tag string) bool {
	v, err := semver.ParseTolerant(tag)
	if err != nil || !knownTalos(tag) {
		return false
	}
	return v.LT(firstWithoutGenericInstaller)
}

// knownTalos reports whether tag is a Talos release machinery knows: 1.x.y
// up to machinery's own minor.
func knownTalos(tag string) bool {
	if !strings.HasPrefix(tag, "v") {
		return false
	}
	v, err := semver.ParseTolerant(tag)
	if err != nil {
		return false
	}
	own := semver.MustParse(strings.TrimPrefix(version.Tag, "v"))
	return v.Major == 1 && v.Minor <= own.Minor && len(v.Pre) == 0
}

// knownKubernetes reports whether tag is a Kubernetes release some Talos
// machinery knows supports.
func knownKubernetes(tag string) bool {
	if !strings.HasPrefix(tag, "v") {
		return false
	}
	k, err := compatibility.ParseKubernetesVersion(strings.TrimPrefix(tag, "v"))
	if err != nil {
		return false
	}
	own := semver.MustParse(strings.TrimPrefix(version.Tag, "v"))
	for minor := own.Minor; minor >= 2; minor-- {
		t, err := compatibility.ParseTalosVersion(&machineapi.VersionInfo{Tag: fmt.Sprintf("v1.%d.0", minor)})
		if err == nil && k.SupportedWith(t) == nil {
			return true
		}
	}
	return false
}

// Containerd namespaces of a machine's image store, as Talos names them.
const (
	// NamespaceSystem is Talos' own: the installer, the kubelet, etcd.
	NamespaceSystem = "system"
	// NamespaceCRI is the CRI's, k8s.io: the pods' images.
	NamespaceCRI = "k8s.io"
)

// ContainerdNamespace maps the API's namespace to the store's ("" for one
// the simulator does not keep).
func ContainerdNamespace(ns common.ContainerdNamespace) string {
	switch ns {
	case common.ContainerdNamespace_NS_SYSTEM:
		return NamespaceSystem
	case common.ContainerdNamespace_NS_CRI:
		return NamespaceCRI
	}
	return ""
}

// hasImage reports whether the machine's store holds ref (normalized) in
// the namespace.
func (m *Machine) hasImage(ns, ref string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.images[ns][ref]
}

// storeImage records ref (normalized) in the namespace of the store.
func (m *Machine) storeImage(ns, ref string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.images == nil {
		m.images = map[string]map[string]bool{}
	}
	if m.images[ns] == nil {
		m.images[ns] = map[string]bool{}
	}
	m.images[ns][ref] = true
}

// Images lists what the machine's store holds in a namespace, normalized.
func (m *Machine) Images(ns string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for ref := range m.images[ns] {
		out = append(out, ref)
	}
	slices.Sort(out)
	return out
}
