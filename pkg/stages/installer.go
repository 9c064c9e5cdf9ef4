package stages

import (
	"fmt"
	"strings"

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

// Why an installer was chosen (Installer.Source).
const (
	// InstallerFlag: --image, for every node.
	InstallerFlag = "flag"
	// InstallerConfigured: the installer the node's config names, tag
	// moved to the target (no schematic to keep, or the configured image
	// is already the factory installer of the node's schematic).
	InstallerConfigured = "configured"
	// InstallerSchematic: the Image Factory installer of the node's
	// schematic, derived because the configured image does not carry it.
	InstallerSchematic = "schematic"
)

// Installer is the installer a node is upgraded with and why.
type Installer struct {
	// Image is the installer image, tagged with the target.
	Image string
	// Source says where it comes from: InstallerFlag, InstallerConfigured or
	// InstallerSchematic.
	Source string
	// Schematic is the Image Factory schematic ID the node runs ("" when none).
	Schematic string
	// Extensions are the system extensions the node runs (the schematic's
	// virtual extension left out).
	Extensions []string
}

// Reason says in a few words why this installer, for the plan; "" for the
// plain case (the configured installer of a node without extensions).
func (i Installer) Reason() string {
	switch i.Source {
	case InstallerFlag:
		return "--image"
	case InstallerSchematic:
		return "the node's schematic " + shortSchematic(i.Schematic) + keeps(i.Extensions) + "; its config names another installer"
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
//   - explicit (--image) when set, whatever the node runs;
//   - the node runs an Image Factory schematic: the configured installer
//     when it is the factory installer of that same schematic (tag moved to
//     target), else that factory's installer of the schematic for the
//     node's platform (<factory>/<platform>-installer[-secureboot]/<id>),
//     the factory read from the schematic's virtual extension;
//   - the node runs no extension: the configured installer, tag moved;
//   - otherwise (extensions but no schematic, a configured factory installer
//     of another schematic, a factory that cannot be told, nothing read or
//     configured) an error that names the node and says what to pass.
func ChooseInstaller(node, configured string, installed *talos.Installed, explicit string, target Version) (Installer, error) {
	if explicit != "" {
		return Installer{Image: explicit, Source: InstallerFlag}, nil
	}

	if installed == nil {
		return Installer{}, fmt.Errorf("node %q: its system extensions were not read: pass the installer with --image REPOSITORY:%s", node, target)
	}

	out := Installer{Extensions: installed.SystemExtensions()}

	schematic, hasSchematic := installed.Schematic()
	if !hasSchematic {
		if len(out.Extensions) > 0 {
			return Installer{}, fmt.Errorf("node %q runs system extensions (%s) but no Image Factory schematic: the installer that keeps them cannot be derived: pass it with --image REPOSITORY:%s",
				node, strings.Join(out.Extensions, ", "), target)
		}

		return configuredInstaller(node, configured, target, out)
	}

	out.Schematic = schematic.Version
	if !isSchematicID(out.Schematic) {
		return Installer{}, fmt.Errorf("node %q: its schematic extension has version %q, not a schematic ID: pass the installer with --image <factory>/installer/<schematic>:%s",
			node, out.Schematic, target)
	}

	if f, ok := parseFactoryInstaller(render.RepositoryOf(configured)); ok {
		if f.schematic != out.Schematic {
			return Installer{}, fmt.Errorf("node %q runs schematic %s but its config names the installer of schematic %s (%s): pass the one to install with --image, e.g. --image %s/%s/%s:%s",
				node, shortSchematic(out.Schematic), shortSchematic(f.schematic), configured, f.base, f.name, out.Schematic, target)
		}

		return configuredInstaller(node, configured, target, out)
	}

	base := factoryBase(schematic.Author)
	if base == "" {
		return Installer{}, fmt.Errorf("node %q runs schematic %s but its Image Factory is not named (extension author %q): pass the installer with --image <factory>/installer/%s:%s",
			node, shortSchematic(out.Schematic), schematic.Author, out.Schematic, target)
	}

	name := "installer"
	if installed.Platform != "" {
		name = installed.Platform + "-installer"
	}

	if installed.SecureBoot {
		name += "-secureboot"
	}

	out.Image = fmt.Sprintf("%s/%s/%s:%s", base, name, out.Schematic, target)
	out.Source = InstallerSchematic

	return out, nil
}

// configuredInstaller is the configured installer with its tag moved to target.
func configuredInstaller(node, configured string, target Version, out Installer) (Installer, error) {
	if configured == "" {
		return Installer{}, fmt.Errorf("node %q: its machine config names no installer (machine.install.image): pass the installer with --image REPOSITORY:%s", node, target)
	}

	image, err := render.WithTag(configured, target.String())
	if err != nil {
		return Installer{}, fmt.Errorf("node %q: installer image %q: %w: pass the installer with --image REPOSITORY:%s", node, configured, err, target)
	}

	out.Image, out.Source = image, InstallerConfigured

	return out, nil
}
