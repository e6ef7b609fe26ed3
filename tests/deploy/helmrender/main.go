// helmrender renders a Helm chart's templates the way `helm template` does, for the checks in
// tests/deploy where no helm binary exists: Go's text/template with Sprig v3's functions (as Helm
// 3 uses them) and Helm's own include, tpl, required, toYaml, toJson and fromYaml, values merged
// like Helm's (maps deep-merged, null deletes a key), missing keys rendering as empty. Not Helm:
// no hooks, no subcharts, no lookup against a cluster, no schema validation.
//
// Build (Debian: golang-go golang-github-masterminds-sprig-dev golang-github-ghodss-yaml-dev):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o helmrender .
//
// Usage: helmrender CHART_DIR RELEASE NAMESPACE [VALUES_FILE...]
// Writes the rendered manifests to stdout ("---" separated), NOTES.txt to stderr; exit 1 on a
// template error.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"github.com/ghodss/yaml"
)

func load(path string) (map[string]interface{}, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m := map[string]interface{}{}
	if err := yaml.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return m, nil
}

// coalesce merges src into dst as Helm merges values files: maps deep, null deletes.
func coalesce(dst, src map[string]interface{}) {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		if sm, ok := v.(map[string]interface{}); ok {
			if dm, ok := dst[k].(map[string]interface{}); ok {
				coalesce(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

func toYaml(v interface{}) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(b), "\n")
}

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: helmrender CHART_DIR RELEASE NAMESPACE [VALUES_FILE...]")
		os.Exit(2)
	}
	chart, release, namespace := os.Args[1], os.Args[2], os.Args[3]
	values, err := load(filepath.Join(chart, "values.yaml"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, f := range os.Args[4:] {
		more, err := load(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		coalesce(values, more)
	}
	meta, err := load(filepath.Join(chart, "Chart.yaml"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	chartName, _ := meta["name"].(string)

	t := template.New("gotpl").Option("missingkey=zero")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env") // Helm removes these two.
	delete(funcs, "expandenv")
	funcs["toYaml"] = toYaml
	funcs["toJson"] = func(v interface{}) string {
		b, _ := json.Marshal(v)
		return string(b)
	}
	funcs["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	funcs["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil || v == "" {
			return v, fmt.Errorf("%s", msg)
		}
		return v, nil
	}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		err := t.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		c, err := t.Clone()
		if err != nil {
			return "", err
		}
		x, err := c.New("tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf bytes.Buffer
		err = x.Execute(&buf, data)
		return buf.String(), err
	}
	funcs["lookup"] = func(...interface{}) map[string]interface{} { return map[string]interface{}{} }
	t.Funcs(funcs)

	files, _ := filepath.Glob(filepath.Join(chart, "templates", "*"))
	sort.Strings(files)
	prefix := chartName + "/templates/"
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if _, err := t.New(prefix + filepath.Base(f)).Parse(string(b)); err != nil {
			fmt.Fprintln(os.Stderr, "parse error:", err)
			os.Exit(1)
		}
	}
	failed := false
	for _, f := range files {
		base := filepath.Base(f)
		if strings.HasPrefix(base, "_") {
			continue
		}
		data := map[string]interface{}{
			"Values": values,
			"Release": map[string]interface{}{"Name": release, "Namespace": namespace,
				"Service": "Helm", "IsInstall": true, "IsUpgrade": false, "Revision": 1},
			"Chart": map[string]interface{}{"Name": meta["name"], "Version": meta["version"],
				"AppVersion": meta["appVersion"], "KubeVersion": meta["kubeVersion"]},
			"Capabilities": map[string]interface{}{
				"KubeVersion": map[string]interface{}{"Version": "v1.29.0", "Major": "1", "Minor": "29"}},
			"Template": map[string]interface{}{"Name": prefix + base, "BasePath": prefix[:len(prefix)-1]},
		}
		var buf bytes.Buffer
		if err := t.ExecuteTemplate(&buf, prefix+base, data); err != nil {
			fmt.Fprintln(os.Stderr, "render error:", err)
			failed = true
			continue
		}
		out := strings.ReplaceAll(buf.String(), "<no value>", "")
		if strings.TrimSpace(out) == "" {
			continue
		}
		if base == "NOTES.txt" {
			fmt.Fprintln(os.Stderr, out)
			continue
		}
		fmt.Printf("---\n# Source: %s%s\n%s\n", prefix, base, out)
	}
	if failed {
		os.Exit(1)
	}
}
