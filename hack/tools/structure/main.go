// Command structure prints the figures issue 25's structure pass is judged by, for the
// packages it is given (default ./pkg/...): types with the most methods, files over the
// line limit (tests are not counted), the longest functions, and per package how many of the references between its
// files point back up (against the order that makes the fewest do so).
//
//	cd hack/tools && go run ./structure -C ../.. ./pkg/...
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/types"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/tools/go/packages"
)

func main() {
	dir := flag.String("C", ".", "directory of the module to measure")
	maxMethods := flag.Int("max-methods", 40, "methods per type above which a type is listed as over")
	maxLines := flag.Int("max-lines", 600, "lines per non-generated file above which it is listed as over")
	top := flag.Int("top", 10, "how many of the largest types and longest functions to list")
	flag.Parse()
	patterns := flag.Args()
	if len(patterns) == 0 {
		patterns = []string{"./pkg/..."}
	}
	cfg := &packages.Config{Dir: *dir, Mode: packages.NeedName | packages.NeedFiles | packages.NeedSyntax |
		packages.NeedTypes | packages.NeedTypesInfo}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if packages.PrintErrors(pkgs) > 0 {
		os.Exit(1)
	}
	root, _ := filepath.Abs(*dir)
	rel := func(p string) string {
		if r, err := filepath.Rel(root, p); err == nil {
			return r
		}
		return p
	}

	type count struct {
		name string
		n    int
	}
	var methods, funcs, files []count
	var up, between int
	var perPkg []string
	for _, p := range pkgs {
		var names []string
		syntax := map[string]*ast.File{}
		for _, f := range p.Syntax {
			name := p.Fset.File(f.Pos()).Name()
			if ast.IsGenerated(f) {
				continue
			}
			names = append(names, name)
			syntax[name] = f
			files = append(files, count{rel(name), p.Fset.File(f.Pos()).LineCount()})
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				n := p.Fset.Position(fd.End()).Line - p.Fset.Position(fd.Pos()).Line + 1
				funcs = append(funcs, count{fmt.Sprintf("%s %s", rel(name), funcName(fd)), n})
			}
		}
		scope := p.Types.Scope()
		for _, n := range scope.Names() {
			tn, ok := scope.Lookup(n).(*types.TypeName)
			if !ok {
				continue
			}
			named, ok := tn.Type().(*types.Named)
			if !ok || named.NumMethods() == 0 {
				continue
			}
			methods = append(methods, count{p.PkgPath + "." + n, named.NumMethods()})
		}
		edges := fileEdges(p, syntax)
		b, u := backEdges(names, edges)
		between += b
		up += u
		if b > 0 {
			perPkg = append(perPkg, fmt.Sprintf("  %-50s %3d files %4d between %4d up", p.PkgPath, len(names), b, u))
		}
	}

	byN := func(c []count) {
		sort.Slice(c, func(i, j int) bool { return c[i].n > c[j].n || c[i].n == c[j].n && c[i].name < c[j].name })
	}
	byN(methods)
	byN(funcs)
	byN(files)
	fmt.Printf("types with the most methods (limit %d):\n", *maxMethods)
	for i, c := range methods {
		if i >= *top && c.n <= *maxMethods {
			break
		}
		fmt.Printf("  %4d %s%s\n", c.n, c.name, over(c.n, *maxMethods))
	}
	fmt.Printf("files over %d lines (non-generated, non-test):\n", *maxLines)
	for _, c := range files {
		if c.n <= *maxLines {
			break
		}
		fmt.Printf("  %4d %s\n", c.n, c.name)
	}
	fmt.Println("longest functions:")
	for _, c := range funcs[:min(*top, len(funcs))] {
		fmt.Printf("  %4d %s\n", c.n, c.name)
	}
	fmt.Println("references between a package's files (file pairs), and those pointing back up:")
	sort.Strings(perPkg)
	for _, l := range perPkg {
		fmt.Println(l)
	}
	fmt.Printf("  total: %d between, %d up\n", between, up)
}

func over(n, limit int) string {
	if n > limit {
		return "  OVER"
	}
	return ""
}

func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// fileEdges returns, per file, the set of other files of the package whose declarations
// (package-level objects, methods, fields) it uses.
func fileEdges(p *packages.Package, syntax map[string]*ast.File) map[string]map[string]bool {
	edges := map[string]map[string]bool{}
	for name, f := range syntax {
		ast.Inspect(f, func(n ast.Node) bool {
			id, ok := n.(*ast.Ident)
			if !ok {
				return true
			}
			obj := p.TypesInfo.Uses[id]
			if obj == nil || obj.Pkg() != p.Types || !obj.Pos().IsValid() {
				return true
			}
			if !declaredAtTop(obj) {
				return true
			}
			to := p.Fset.Position(obj.Pos()).Filename
			if _, ours := syntax[to]; !ours || to == name {
				return true
			}
			if edges[name] == nil {
				edges[name] = map[string]bool{}
			}
			edges[name][to] = true
			return true
		})
	}
	return edges
}

// declaredAtTop: package-level objects, and methods and fields, whose file is where they
// are declared; locals and parameters are not references between files.
func declaredAtTop(obj types.Object) bool {
	switch o := obj.(type) {
	case *types.Func:
		return true
	case *types.Var:
		return o.IsField() || o.Parent() == o.Pkg().Scope()
	default:
		return obj.Parent() == obj.Pkg().Scope()
	}
}

// backEdges orders the files so that as few references as possible point back up (Eades,
// Lin and Smyth's greedy order: sinks go last, sources first, otherwise the file with the
// most outgoing over incoming), then counts the file pairs and those pointing up.
func backEdges(files []string, edges map[string]map[string]bool) (between, up int) {
	in := map[string]map[string]bool{}
	for from, tos := range edges {
		for to := range tos {
			if in[to] == nil {
				in[to] = map[string]bool{}
			}
			in[to][from] = true
			between++
		}
	}
	left := map[string]bool{}
	for _, f := range files {
		left[f] = true
	}
	deg := func(f string, m map[string]map[string]bool) int {
		n := 0
		for g := range m[f] {
			if left[g] {
				n++
			}
		}
		return n
	}
	var head, tail []string
	for len(left) > 0 {
		progress := true
		for progress {
			progress = false
			for _, f := range sorted(left) {
				if deg(f, edges) == 0 {
					tail = append(tail, f)
					delete(left, f)
					progress = true
				} else if deg(f, in) == 0 {
					head = append(head, f)
					delete(left, f)
					progress = true
				}
			}
		}
		if len(left) == 0 {
			break
		}
		best, bestD := "", 0
		for _, f := range sorted(left) {
			if d := deg(f, edges) - deg(f, in); best == "" || d > bestD {
				best, bestD = f, d
			}
		}
		head = append(head, best)
		delete(left, best)
	}
	pos := map[string]int{}
	order := head
	for i := len(tail) - 1; i >= 0; i-- {
		order = append(order, tail[i])
	}
	for i, f := range order {
		pos[f] = i
	}
	for from, tos := range edges {
		for to := range tos {
			if pos[to] < pos[from] {
				up++
			}
		}
	}
	return between, up
}

func sorted(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
