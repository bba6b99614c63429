// Command modrelease keeps the modules of this repository releasable
// together: every nested module requires the root module, and the nested
// modules it imports, at the one release version, with a replace to their
// directory for development (Go ignores a dependency's replace, so users
// resolve the released versions).
//
// Run it from the repository root (it reads go.work):
//
//	go run ./benchmarks/internal/modrelease version        # print the release version; fail if a go.mod disagrees
//	go run ./benchmarks/internal/modrelease set v0.2.0     # require every in-repo module at v0.2.0
//	go run ./benchmarks/internal/modrelease proxy DIR      # write a module proxy (GOPROXY=file://DIR) of every module at the release version
//	go run ./benchmarks/internal/modrelease list           # print each module's path and directory
//	go run ./benchmarks/internal/modrelease changelog v0.2.0 2026-12-07 # CHANGELOG.md's Unreleased section becomes v0.2.0's
//
// The proxy is what CI resolves the modules from before a version is
// tagged: each zip holds the files git tracks in the module, as a tag
// would, with their content in the working tree.
package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

// root is the module path every module of the repository starts with.
const root = "github.com/throttlekit/throttle"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "modrelease:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: modrelease version | set VERSION | proxy DIR | list | changelog VERSION DATE")
	}
	if args[0] == "changelog" && len(args) == 3 {
		return changelog("CHANGELOG.md", args[1], args[2])
	}
	mods, err := load(".")
	if err != nil {
		return err
	}
	switch {
	case args[0] == "version" && len(args) == 1:
		v, err := version(mods)
		if err == nil {
			fmt.Println(v)
		}
		return err
	case args[0] == "list" && len(args) == 1:
		for _, m := range mods {
			fmt.Println(m.path, m.dir)
		}
		return nil
	case args[0] == "set" && len(args) == 2:
		return set(mods, args[1])
	case args[0] == "proxy" && len(args) == 2:
		return proxy(mods, args[1])
	}
	return fmt.Errorf("unknown command %q", strings.Join(args, " "))
}

// mod is one module of the repository.
type mod struct {
	path, dir string // dir relative to the repository root, "." for the root
	file      *modfile.File
	gomod     string // the go.mod file's name
}

// load reads every module go.work lists under repo.
func load(repo string) ([]mod, error) {
	work, err := parse(filepath.Join(repo, "go.work"), modfile.ParseWork)
	if err != nil {
		return nil, err
	}
	var mods []mod
	for _, u := range work.Use {
		dir := filepath.Clean(u.Path)
		gomod := filepath.Join(repo, dir, "go.mod")
		f, err := parse(gomod, modfile.Parse)
		if err != nil {
			return nil, err
		}
		p := f.Module.Mod.Path
		if p != root && p != root+"/"+filepath.ToSlash(dir) {
			return nil, fmt.Errorf("%s: module %s does not match its directory", gomod, p)
		}
		mods = append(mods, mod{path: p, dir: dir, file: f, gomod: gomod})
	}
	return mods, nil
}

// parse reads the file name and parses it with parser (modfile.Parse or
// modfile.ParseWork).
func parse[F any](name string, parser func(name string, data []byte, fix modfile.VersionFixer) (F, error)) (F, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		var none F
		return none, err
	}
	return parser(name, data, nil)
}

// inRepo reports whether path is a module of the repository.
func inRepo(mods []mod, path string) (mod, bool) {
	for _, m := range mods {
		if m.path == path {
			return m, true
		}
	}
	return mod{}, false
}

// version returns the version every in-repo requirement names, checking
// that each has its development replace to the module's directory.
func version(mods []mod) (string, error) {
	v := ""
	var errs []error
	for _, m := range mods {
		for _, r := range m.file.Require {
			dep, ok := inRepo(mods, r.Mod.Path)
			if !ok {
				continue
			}
			switch {
			case v == "":
				v = r.Mod.Version
			case r.Mod.Version != v:
				errs = append(errs, fmt.Errorf("%s requires %s %s, others %s", m.gomod, r.Mod.Path, r.Mod.Version, v))
			}
			if !replaced(m, dep) {
				errs = append(errs, fmt.Errorf("%s: no replace of %s by its directory for development", m.gomod, r.Mod.Path))
			}
		}
	}
	if v == "" {
		errs = append(errs, errors.New("no module requires another of the repository"))
	} else if !semver.IsValid(v) || semver.Prerelease(v) != "" || semver.Build(v) != "" {
		errs = append(errs, fmt.Errorf("release version %s is not vMAJOR.MINOR.PATCH", v))
	}
	return v, errors.Join(errs...)
}

// replaced reports whether m replaces dep by dep's directory.
func replaced(m, dep mod) bool {
	want, err := filepath.Rel(m.dir, dep.dir)
	if err != nil {
		return false
	}
	for _, r := range m.file.Replace {
		if r.Old.Path == dep.path && r.Old.Version == "" && r.New.Version == "" &&
			filepath.Clean(r.New.Path) == want {
			return true
		}
	}
	return false
}

// set requires every in-repo module at v in every go.mod.
func set(mods []mod, v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v || semver.Prerelease(v) != "" {
		return fmt.Errorf("version %q is not vMAJOR.MINOR.PATCH", v)
	}
	for _, m := range mods {
		changed := false
		for _, r := range m.file.Require {
			if _, ok := inRepo(mods, r.Mod.Path); ok && r.Mod.Version != v {
				if err := m.file.AddRequire(r.Mod.Path, v); err != nil {
					return err
				}
				changed = true
			}
		}
		if !changed {
			continue
		}
		m.file.Cleanup()
		data, err := m.file.Format()
		if err != nil {
			return err
		}
		if err := os.WriteFile(m.gomod, data, 0o644); err != nil {
			return err
		}
	}
	_, err := version(mods)
	return err
}

// proxy writes every module at the release version into dir, laid out as
// GOPROXY=file://dir expects, and prints each module's path.
func proxy(mods []mod, dir string) error {
	v, err := version(mods)
	if err != nil {
		return err
	}
	info := fmt.Sprintf("{\"Version\":%q,\"Time\":%q}\n", v, time.Now().UTC().Format(time.RFC3339))
	for _, m := range mods {
		esc, err := module.EscapePath(m.path)
		if err != nil {
			return err
		}
		at := filepath.Join(dir, filepath.FromSlash(esc), "@v")
		if err := os.MkdirAll(at, 0o755); err != nil {
			return err
		}
		gomod, err := os.ReadFile(m.gomod)
		if err != nil {
			return err
		}
		for name, data := range map[string]string{"list": v + "\n", v + ".info": info, v + ".mod": string(gomod)} {
			if err := os.WriteFile(filepath.Join(at, name), []byte(data), 0o644); err != nil {
				return err
			}
		}
		if err := writeZip(filepath.Join(at, v+".zip"), module.Version{Path: m.path, Version: v}, m.dir, mods); err != nil {
			return fmt.Errorf("%s: %w", path.Join(m.path, "@v", v), err)
		}
		fmt.Println(m.path)
	}
	return nil
}

// writeZip writes the zip of module v in dir from the files git tracks
// there, as a tag would make it (files of nested modules left out), with
// their content in the working tree.
func writeZip(name string, v module.Version, dir string, mods []mod) error {
	out, err := exec.Command("git", "ls-files", "-z", "--", dir).Output()
	if err != nil {
		return fmt.Errorf("git ls-files: %w", err)
	}
	var files []modzip.File
	for _, p := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if p == "" || owner(mods, p) != dir {
			continue
		}
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			continue // deleted, not yet committed
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		files = append(files, file{rel: filepath.ToSlash(rel), name: p})
	}
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	err = modzip.Create(f, v, files)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// owner returns the directory of the module a repository file belongs
// to: the deepest module directory above it.
func owner(mods []mod, p string) string {
	best := ""
	for _, m := range mods {
		if m.dir == "." || strings.HasPrefix(p, m.dir+string(filepath.Separator)) {
			if best == "" || len(m.dir) > len(best) || best == "." {
				best = m.dir
			}
		}
	}
	return best
}

// file is a repository file put in a module zip.
type file struct{ rel, name string }

func (f file) Path() string                 { return f.rel }
func (f file) Lstat() (os.FileInfo, error)  { return os.Lstat(f.name) }
func (f file) Open() (io.ReadCloser, error) { return os.Open(f.name) }

// changelog turns the Unreleased section of the changelog at name into
// version's, headed "version — date", under a new, empty Unreleased
// section. It fails if there is no Unreleased section, if it is empty, or
// if version already has a section.
func changelog(name, version, date string) error {
	data, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	text := string(data)
	if !semver.IsValid(version) || semver.Canonical(version) != version || semver.Prerelease(version) != "" {
		return fmt.Errorf("version %q is not vMAJOR.MINOR.PATCH", version)
	}
	if _, err := time.Parse(time.DateOnly, date); err != nil {
		return fmt.Errorf("date %q is not YYYY-MM-DD", date)
	}
	head := unreleased.FindStringIndex(text)
	if head == nil {
		return fmt.Errorf("%s has no Unreleased section", name)
	}
	body := text[head[1]:]
	if next := strings.Index(body, "\n## "); next >= 0 {
		body = body[:next]
	}
	if strings.TrimSpace(body) == "" {
		return fmt.Errorf("%s: the Unreleased section is empty", name)
	}
	if regexp.MustCompile(`(?m)^## \[?` + regexp.QuoteMeta(version) + `\b`).MatchString(text) {
		return fmt.Errorf("%s already has a section for %s", name, version)
	}
	text = text[:head[0]] + "## [Unreleased]\n\n## " + version + " — " + date + "\n" + text[head[1]:]
	return os.WriteFile(name, []byte(text), 0o644)
}

// unreleased matches the heading of a changelog's Unreleased section.
var unreleased = regexp.MustCompile(`(?m)^## \[?Unreleased\]?[^\n]*\n`)
