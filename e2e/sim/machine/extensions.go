package machine

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/extensions"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
)

// Extension is one system extension a machine was installed with, as its
// manifest names it. Image Factory adds a virtual one to every image it
// builds: name "schematic", version the schematic ID, author
// "Image Factory (<its URL>)".
type Extension struct {
	Name    string
	Version string
	Author  string
}

// SchematicExtensionName is the name of Image Factory's virtual extension
// (machinery's constants.ImageFactorySchematicExtensionName).
const SchematicExtensionName = "schematic"

// schematicOf returns the schematic ID among exts, "" when none.
func schematicOf(exts []Extension) string {
	for _, e := range exts {
		if e.Name == SchematicExtensionName {
			return e.Version
		}
	}
	return ""
}

// factorySchematic returns the schematic ID of an Image Factory installer
// reference (<host>/<name>/<schematic>:<version>, name "installer" or
// "<platform>-installer", either with "-secureboot"), "" when image is not
// one.
func factorySchematic(image string) string {
	repo := image
	if i := strings.LastIndex(repo, "@"); i >= 0 {
		repo = repo[:i]
	}
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	parts := strings.Split(repo, "/")
	if len(parts) < 3 {
		return ""
	}
	name := strings.TrimSuffix(parts[len(parts)-2], "-secureboot")
	if name != "installer" && !strings.HasSuffix(name, "-installer") {
		return ""
	}
	return parts[len(parts)-1]
}

// installerExtensions returns the extensions an installer image carries into
// the boot it installs, for a machine that runs current: the factory
// installer of the machine's own schematic carries the same extensions; the
// factory installer of another schematic carries that schematic (the
// simulator does not know what else is in it; the empty schematic's
// installer, Talos 1.14's default, carries it alone); any other installer (the
// plain ghcr.io/siderolabs/installer, a mirror of it) carries none, as a
// real upgrade with it drops every extension.
func installerExtensions(image string, current []Extension) []Extension {
	id := factorySchematic(image)
	switch {
	case id == "":
		return nil
	case id == schematicOf(current):
		return slices.Clone(current)
	default:
		// Image Factory signs its virtual extension "Image Factory (<its
		// URL>)": the factory the image comes from, or for a mirror the one
		// that built the running schematic.
		author := "Image Factory"
		for _, e := range current {
			if e.Name == SchematicExtensionName {
				author = e.Author
			}
		}
		if r, err := parseImageRef(image); err == nil && r.host == registryFactory {
			author = "Image Factory (https://" + registryFactory + ")"
		}
		return []Extension{{Name: SchematicExtensionName, Version: id, Author: author}}
	}
}

// publishExtensions writes what machined publishes of the installed
// extensions at boot: an ExtensionStatus per layer (IDs "0", "1", ... as the
// imager numbers them), on Talos 1.14 the ImageFactorySchematic resource
// when a schematic is among them, and the SecurityState (no SecureBoot; the
// boot loader of Options.BootedWithUKI).
func (m *Machine) publishExtensions(ctx context.Context, version string, exts []Extension) error {
	for i, e := range exts {
		id := strconv.Itoa(i)
		if err := safe.StateModify(ctx, m.cosi, runtime.NewExtensionStatus(runtime.NamespaceName, id), func(r *runtime.ExtensionStatus) error {
			*r.TypedSpec() = extensions.Layer{
				Image: id + ".sqsh",
				Metadata: extensions.Metadata{
					Name: e.Name, Version: e.Version, Author: e.Author,
					Compatibility: extensions.Compatibility{Talos: extensions.Constraint{Version: ">= 1.0.0"}},
				},
			}
			return nil
		}); err != nil {
			return fmt.Errorf("extension status %s: %w", id, err)
		}
	}
	if id := schematicOf(exts); id != "" && talosMinor(version) >= 14 {
		flavor, url := "", ""
		for _, e := range exts {
			if e.Name == SchematicExtensionName {
				flavor, url = splitAuthor(e.Author)
			}
		}
		if err := safe.StateModify(ctx, m.cosi, runtime.NewImageFactorySchematic(runtime.NamespaceName, runtime.ImageFactorySchematicID), func(r *runtime.ImageFactorySchematic) error {
			r.TypedSpec().SchematicID, r.TypedSpec().Flavor, r.TypedSpec().APIURL = id, flavor, url
			return nil
		}); err != nil {
			return fmt.Errorf("image factory schematic: %w", err)
		}
	}
	if err := safe.StateModify(ctx, m.cosi, runtime.NewSecurityStateSpec(runtime.NamespaceName), func(r *runtime.SecurityState) error {
		r.TypedSpec().SecureBoot = false
		r.TypedSpec().BootedWithUKI = m.opts.BootedWithUKI
		return nil
	}); err != nil {
		return fmt.Errorf("security state: %w", err)
	}
	return nil
}

// splitAuthor splits "Image Factory (https://factory.talos.dev)" into the
// flavor and the URL, as Talos' ImageFactorySchematicController does.
func splitAuthor(author string) (string, string) {
	i := strings.LastIndex(author, " (")
	if i < 0 {
		return author, ""
	}
	return author[:i], strings.TrimSuffix(author[i+2:], ")")
}
