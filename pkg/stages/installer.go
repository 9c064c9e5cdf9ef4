package stages

import (
	"fmt"
	"slices"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/gendata"

	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// The installer a Talos upgrade uses decides what the node runs after the
// reboot: its kernel, its system extensions, its Image Factory schematic
// (extensions, kernel arguments, overlay). Talos does not rewrite the
// installer its config names when a node moves to a schematic (talosctl
// upgrade --image does not touch the config), so a node moved to a schematic
// with iscsi-tools or drbd usually still names the plain
// ghcr.io/siderolabs/installer: installing that drops its extensions.
// ChooseInstaller therefore starts from what the node runs, read from Talos
// (ExtensionStatus resources, the schematic among them), not from its config.
//
// From Talos 1.14 the plain installer is no longer published (talos#13138;
// Talos' pkg/images: the generic repository is "only used for legacy
// installer for Talos <1.11.0 and during tests"): Talos' own default is the
// Image Factory's installer of the empty schematic for the node's platform,
// which is what a node that runs nothing is upgraded with.

// Why an installer was chosen (Installer.Source).
const (
	// InstallerFlag: --installer-image, for every node or for this one.
	InstallerFlag = "flag"
	// InstallerConfigured: the installer the node's config names, tag
	// moved to the target (no schematic to keep, or the configured image
	// is already the factory installer of the node's schematic).
	InstallerConfigured = "configured"
	// InstallerSchematic: the Image Factory installer of the node's
	// schematic, derived because the configured image does not carry it.
	InstallerSchematic = "schematic"
	// InstallerDefault: Talos' default installer of the target, the Image
	// Factory's of the empty schematic, for a node that runs nothing and
	// names the generic installer (or none), which the target does not
	// publish.
	InstallerDefault = "default"
)

// EmptySchematic is the ID of Image Factory's empty schematic (no
// extension, no kernel argument, no overlay), whose installer is Talos 1.14's
// default: Talos' pkg/images.DefaultInstallerImageSchematic, which lives in
// Talos' own module, not in machinery.
const EmptySchematic = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"

// firstWithoutGenericInstaller is the first Talos release whose generic
// installer was not published.
var firstWithoutGenericInstaller = MustParseVersion("v1.14.0")

// genericInstallerPath is the generic installer's path on any registry
// ("siderolabs/installer"), genericInstaller its repository on Talos' own
// ("ghcr.io/siderolabs/installer"), from machinery's build data.
var (
	genericInstallerPath = gendata.ImagesUsername + "/installer"
	genericInstaller     = gendata.ImagesRegistry + "/" + genericInstallerPath
)

// Installer is the installer a node is upgraded with and why.
type Installer struct {
	// Image is the installer image, tagged with the target.
	Image string
	// Source says where it comes from: InstallerFlag, InstallerConfigured,
	// InstallerSchematic or InstallerDefault.
	Source string
	// Schematic is the Image Factory schematic ID the node runs ("" when none).
	Schematic string
	// Extensions are the system extensions the node runs (the schematic's
	// virtual extension left out).
	Extensions []string
	// Drops lists what the node runs that the installer does not carry,
	// accepted with --drop-extensions (InstallerFlag only).
	Drops []string
	// Expect is what the node must run after its reboot into the installer.
	Expect InstallExpect
}

// InstallExpect is what a node must run once it has booted the installer it
// was upgraded with: checked after every reboot (a node that came back
// without them pauses, cordoned).
type InstallExpect struct {
	// Schematic is the Image Factory schematic the installer carries (""
	// when it is not a factory installer: nothing to check).
	Schematic string `json:"schematic,omitempty"`
	// Extensions are the system extensions, by name, the node ran and the
	// installer keeps.
	Extensions []string `json:"extensions,omitempty"`
}

// Missing lists what of the expectation a node does not run: a schematic
// other than the one its installer carries, extensions it no longer runs.
func (x InstallExpect) Missing(runs talos.Installed) []string {
	var out []string

	if x.Schematic != "" {
		got := "none"
		if s, ok := runs.Schematic(); ok {
			got = shortSchematic(s.Version)
		}

		if s, ok := runs.Schematic(); !ok || s.Version != x.Schematic {
			out = append(out, fmt.Sprintf("schematic %s (it runs %s)", shortSchematic(x.Schematic), got))
		}
	}

	exts := runs.SystemExtensions()

	for _, e := range x.Extensions {
		if !slices.Contains(exts, e) {
			out = append(out, e)
		}
	}

	return out
}

// Empty reports whether there is nothing to check.
func (x InstallExpect) Empty() bool { return x.Schematic == "" && len(x.Extensions) == 0 }

// Reason says in a few words why this installer, for the plan; "" for the
// plain case (the configured installer of a node without extensions).
func (i Installer) Reason() string {
	switch i.Source {
	case InstallerFlag:
		if len(i.Drops) > 0 {
			return "--installer-image, with --drop-extensions: drops " + strings.Join(i.Drops, ", ")
		}

		return "--installer-image"
	case InstallerSchematic:
		return "the node's schematic " + shortSchematic(i.Schematic) + keeps(i.Extensions) + "; its config names another installer"
	case InstallerDefault:
		return "Talos " + firstWithoutGenericInstaller.MinorString() + " publishes no " + genericInstaller +
			": Talos' default, the Image Factory installer of the empty schematic"
	}

	if i.Schematic != "" {
		return "configured, the node's schematic " + shortSchematic(i.Schematic) + keeps(i.Extensions)
	}

	return ""
}

func keeps(exts []string) string {
	if len(exts) == 0 {
		return ""
	}

	return " (keeps " + strings.Join(exts, ", ") + ")"
}

// shortSchematic shortens a schematic ID for a line of text.
func shortSchematic(id string) string {
	if len(id) > 12 {
		return id[:12]
	}

	return id
}

// factoryInstaller is an Image Factory installer reference, parsed:
// <host>[/<prefix>]/<name>/<schematic>:<version>, name "installer" or
// "<platform>-installer", either with "-secureboot".
type factoryInstaller struct {
	base      string // <host>[/<prefix>]
	name      string
	schematic string
}

// parseFactoryInstaller reads a repository as an Image Factory installer,
// ok false when it is not one (ghcr.io/siderolabs/installer, a mirror).
func parseFactoryInstaller(repository string) (factoryInstaller, bool) {
	parts := strings.Split(repository, "/")
	if len(parts) < 3 {
		return factoryInstaller{}, false
	}

	name, schematic := parts[len(parts)-2], parts[len(parts)-1]
	if !isSchematicID(schematic) {
		return factoryInstaller{}, false
	}

	trimmed := strings.TrimSuffix(name, "-secureboot")
	if trimmed != "installer" && !strings.HasSuffix(trimmed, "-installer") {
		return factoryInstaller{}, false
	}

	return factoryInstaller{base: strings.Join(parts[:len(parts)-2], "/"), name: name, schematic: schematic}, true
}

// FactorySchematic returns the schematic an installer image carries and the host (and
// path) of the Image Factory that serves it, ok false when the image is not a factory
// installer.
func FactorySchematic(image string) (schematic, base string, ok bool) {
	f, ok := parseFactoryInstaller(render.RepositoryOf(image))

	return f.schematic, f.base, ok
}

// installerName is the name of a factory installer for the node's platform
// and SecureBoot state: "<platform>-installer[-secureboot]" (plain
// "installer" when the platform is not known).
func installerName(installed *talos.Installed) string {
	name := "installer"
	if installed.Platform != "" {
		name = installed.Platform + "-installer"
	}

	if installed.SecureBoot {
		name += "-secureboot"
	}

	return name
}

// isGenericInstaller reports whether repository is the generic installer
// on Talos' own registry; isGenericMirror whether it is that path on
// another registry (a mirror of it).
func isGenericInstaller(repository string) bool { return repository == genericInstaller }

func isGenericMirror(repository string) bool {
	return repository != genericInstaller && (repository == genericInstallerPath || strings.HasSuffix(repository, "/"+genericInstallerPath))
}

// IsInstallerImage reports whether an image looks like a Talos installer
// (the generic one, a mirror of it, an Image Factory installer): what
// --image, the Job's image, must not be.
func IsInstallerImage(image string) bool {
	repo := render.RepositoryOf(image)
	_, factory := parseFactoryInstaller(repo)

	return factory || isGenericInstaller(repo) || isGenericMirror(repo)
}

// isSchematicID reports whether s looks like a schematic ID: Image Factory
// names a schematic by the SHA-256 of its content, 64 hex digits.
func isSchematicID(s string) bool {
	if len(s) != 64 {
		return false
	}

	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}

	return true
}

// factoryBase returns the host (and path) of the Image Factory that built
// the schematic, from its virtual extension's author, "Image Factory
// (https://factory.talos.dev)": "factory.talos.dev". "" when the author
// names no URL.
func factoryBase(author string) string {
	open := strings.LastIndex(author, "(")
	if open < 0 || !strings.HasSuffix(author, ")") {
		return ""
	}

	url := strings.TrimSpace(author[open+1 : len(author)-1])

	for _, scheme := range []string{"https://", "http://"} {
		if rest, ok := strings.CutPrefix(url, scheme); ok {
			return strings.TrimSuffix(rest, "/")
		}
	}

	return ""
}

// ChooseInstaller returns the installer node is upgraded to target with:
//
//   - explicit (--installer-image, for every node or this one) when set,
//     unless it does not carry the node's schematic or extensions
//     (explicitCarries) and the operator did not accept that for the node
//     (--drop-extensions);
//   - the node runs an Image Factory schematic: the configured installer
//     when it is the factory installer of that same schematic (tag moved to
//     target), else that factory's installer of the schematic for the
//     node's platform (<factory>/<platform>-installer[-secureboot]/<id>),
//     the factory read from the schematic's virtual extension;
//   - the node runs no extension: the configured installer, tag moved;
//     from Talos 1.14, whose generic installer is not published, the
//     generic one (or none) is Talos' default instead, the Image Factory's
//     installer of the empty schematic, and a mirror of the generic one is
//     refused (what it mirrors does not exist; the factory's must be);
//   - otherwise (extensions but no schematic, a configured factory installer
//     of another schematic, a factory that cannot be told, nothing read or
//     configured before 1.14) an error that names the node and says what to
//     pass.
func ChooseInstaller(node, configured string, installed *talos.Installed, flags InstallerFlags, target Version) (Installer, error) {
	if explicit := flags.For(node); explicit != "" {
		return explicitInstaller(node, explicit, installed, flags.Drops(node), target)
	}

	if installed == nil {
		return Installer{}, fmt.Errorf("node %q: its system extensions were not read: pass the installer with --installer-image %s=REPOSITORY:%s", node, node, target)
	}

	out := Installer{Extensions: installed.SystemExtensions()}

	schematic, hasSchematic := installed.Schematic()
	if !hasSchematic {
		if len(out.Extensions) > 0 {
			return Installer{}, fmt.Errorf("node %q runs system extensions (%s) but no Image Factory schematic: the installer that keeps them cannot be derived: pass it with --installer-image %s=REPOSITORY:%s",
				node, strings.Join(out.Extensions, ", "), node, target)
		}

		return vanillaInstaller(node, configured, installed, target, out)
	}

	out.Schematic = schematic.Version
	if !isSchematicID(out.Schematic) {
		return Installer{}, fmt.Errorf("node %q: its schematic extension has version %q, not a schematic ID: pass the installer with --installer-image %s=<factory>/installer/<schematic>:%s",
			node, out.Schematic, node, target)
	}

	out.Expect = InstallExpect{Schematic: out.Schematic, Extensions: out.Extensions}

	if f, ok := parseFactoryInstaller(render.RepositoryOf(configured)); ok {
		if f.schematic != out.Schematic {
			return Installer{}, fmt.Errorf("node %q runs schematic %s but its config names the installer of schematic %s (%s): pass the one to install with --installer-image, e.g. --installer-image %s=%s/%s/%s:%s",
				node, shortSchematic(out.Schematic), shortSchematic(f.schematic), configured, node, f.base, f.name, out.Schematic, target)
		}

		return configuredInstaller(node, configured, target, out)
	}

	base := factoryBase(schematic.Author)
	if base == "" {
		return Installer{}, fmt.Errorf("node %q runs schematic %s but its Image Factory is not named (extension author %q): pass the installer with --installer-image %s=<factory>/installer/%s:%s",
			node, shortSchematic(out.Schematic), schematic.Author, node, out.Schematic, target)
	}

	out.Image = fmt.Sprintf("%s/%s/%s:%s", base, installerName(installed), out.Schematic, target)
	out.Source = InstallerSchematic

	return out, nil
}

// vanillaInstaller is the installer of a node that runs no extension: the
// configured one, or from Talos 1.14 Talos' default for the generic one (or
// none), and a refusal for a mirror of the generic one.
func vanillaInstaller(node, configured string, installed *talos.Installed, target Version, out Installer) (Installer, error) {
	repo := render.RepositoryOf(configured)
	published := target.Compare(firstWithoutGenericInstaller) < 0
	factory := fmt.Sprintf("%s/%s/%s:%s", gendata.ImageFactory, installerName(installed), EmptySchematic, target)

	switch {
	case (configured == "" || isGenericInstaller(repo)) && !published:
		out.Image, out.Source = factory, InstallerDefault
		out.Expect = InstallExpect{Schematic: EmptySchematic}

		return out, nil
	case isGenericMirror(repo) && !published:
		return Installer{}, fmt.Errorf("node %q: its config names %s, a mirror of %s, which Talos %s no longer publishes: mirror %s and pass it with --installer-image %s=<your mirror of it>",
			node, repo, genericInstaller, firstWithoutGenericInstaller.MinorString(), factory, node)
	case configured == "":
		// Before 1.14 Talos' default installer was the generic one.
		configured = genericInstaller + ":" + target.String()
	}

	if f, ok := parseFactoryInstaller(repo); ok {
		out.Expect = InstallExpect{Schematic: f.schematic}
	}

	return configuredInstaller(node, configured, target, out)
}

// configuredInstaller is the configured installer with its tag moved to target.
func configuredInstaller(node, configured string, target Version, out Installer) (Installer, error) {
	image, err := render.WithTag(configured, target.String())
	if err != nil {
		return Installer{}, fmt.Errorf("node %q: installer image %q: %w: pass the installer with --installer-image %s=REPOSITORY:%s", node, configured, err, node, target)
	}

	out.Image, out.Source = image, InstallerConfigured

	return out, nil
}

// explicitInstaller is an installer the operator named for the node,
// refused when it does not carry what the node runs unless drop accepts
// that.
func explicitInstaller(node, explicit string, installed *talos.Installed, drop bool, target Version) (Installer, error) {
	out := Installer{Image: explicit, Source: InstallerFlag}

	f, factory := parseFactoryInstaller(render.RepositoryOf(explicit))
	if factory {
		out.Expect.Schematic = f.schematic
	}

	if installed == nil {
		return out, nil
	}

	out.Extensions = installed.SystemExtensions()
	if s, ok := installed.Schematic(); ok {
		out.Schematic = s.Version
	}

	lost := explicitLoses(explicit, installed)
	if len(lost) == 0 {
		out.Expect.Extensions = out.Extensions

		return out, nil
	}

	if !drop {
		suggest := fmt.Sprintf("REPOSITORY:%s", target)
		if out.Schematic != "" && isSchematicID(out.Schematic) {
			base := gendata.ImageFactory
			if s, _ := installed.Schematic(); factoryBase(s.Author) != "" {
				base = factoryBase(s.Author)
			}

			suggest = fmt.Sprintf("%s/%s/%s:%s", base, installerName(installed), out.Schematic, target)
		}

		return Installer{}, fmt.Errorf("node %q runs %s, which --installer-image %s does not carry: the node would reboot without them: pass one that does (--installer-image %s=%s), or accept losing them with --drop-extensions %s",
			node, strings.Join(lost, ", "), explicit, node, suggest, node)
	}

	out.Drops = lost

	return out, nil
}

// explicitLoses lists what a node runs that the explicit installer is known
// not to carry: a node's schematic (its extensions, kernel arguments,
// overlay) is carried only by that schematic's factory installer (the empty
// schematic carries nothing, so a node on it loses nothing); its extensions
// without a schematic (an installer built with imager) are lost with the
// generic installer, and otherwise cannot be told before the reboot, after
// which they are checked (InstallExpect).
func explicitLoses(explicit string, installed *talos.Installed) []string {
	exts := installed.SystemExtensions()
	repo := render.RepositoryOf(explicit)
	f, factory := parseFactoryInstaller(repo)

	s, hasSchematic := installed.Schematic()

	switch {
	case hasSchematic && s.Version != EmptySchematic && (!factory || f.schematic != s.Version):
		return append([]string{"schematic " + shortSchematic(s.Version)}, exts...)
	case hasSchematic && s.Version == EmptySchematic && len(exts) == 0:
		return nil
	case len(exts) > 0 && (isGenericInstaller(repo) || isGenericMirror(repo)):
		return slices.Clone(exts)
	}

	return nil
}
