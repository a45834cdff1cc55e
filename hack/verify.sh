#!/usr/bin/env bash
# Checks that the tree is as the tools would leave it: no large file tracked but the listed
# data, Go files goimports-formatted, every module's go.mod/go.sum tidy, and the generated
# files what `make generate` writes. Runs every
# check, prints what differs, and exits non-zero if any failed.
#
# The generators run in place, so after a failure the regenerated files stay in the tree for
# review. Only what the generators changed counts: uncommitted edits made before the run do not.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

GO=${GO:-go}
MAKE=${MAKE:-make}
failed=()

# Generated code is checked by regenerating it, not by the formatter.
go_files() { git ls-files -z --cached --others --exclude-standard -- '*.go' ':!:**/zz_generated.*.go' ':!:pkg/client/**'; }

# A compiled binary committed by mistake stays in every clone for ever: no tracked file over
# 1 MiB unless it is a data file listed here (none is yet).
LARGE_DATA_FILES=()
echo "verify: no tracked file over 1 MiB"
large=()
while IFS= read -r -d '' f; do
  [[ -f $f ]] || continue
  if (($(stat -c %s "$f") > 1048576)) && [[ ! " ${LARGE_DATA_FILES[*]} " =~ " $f " ]]; then
    large+=("$f")
  fi
done < <(git ls-files -z --cached)
if ((${#large[@]})); then
  echo "verify: tracked files over 1 MiB (build outputs belong in _output/, ignored by git):" >&2
  printf '  %s\n' "${large[@]}" >&2
  failed+=(large-files)
fi

echo "verify: goimports"
unformatted=$(go_files | xargs -0 -r "$GO" tool -modfile=hack/tools/go.mod goimports -l)
if [[ -n $unformatted ]]; then
  echo "$unformatted" | xargs -r "$GO" tool -modfile=hack/tools/go.mod goimports -d
  echo "verify: not goimports-formatted (run: go tool -modfile=hack/tools/go.mod goimports -w FILE):" >&2
  echo "$unformatted" | sed 's/^/  /' >&2
  failed+=(goimports)
fi

# Every module in the repository, the e2e tool modules too: `go mod tidy -diff` changes nothing.
for gomod in $(git ls-files --cached --others --exclude-standard -- go.mod '*/go.mod'); do
  dir=$(dirname "$gomod")
  echo "verify: go mod tidy ($dir)"
  if ! (cd "$dir" && "$GO" mod tidy -diff); then
    echo "verify: $dir: go.mod/go.sum are not tidy (run: cd $dir && go mod tidy)" >&2
    failed+=("tidy $dir")
  fi
done

# A snapshot of the tracked files as they are now (HEAD when nothing is modified), and the
# untracked ones, so that only the generators' own changes are reported.
before=$(git -c user.name=verify -c user.email=verify@localhost stash create)
before=${before:-HEAD}
untracked_before=$(git ls-files --others --exclude-standard)

echo "verify: make generate"
"$MAKE" --no-print-directory generate

changed=$(git diff --name-only "$before" --)
new=$(comm -13 <(echo "$untracked_before" | sort) <(git ls-files --others --exclude-standard | sort))
if [[ -n $changed || -n $new ]]; then
  [[ -z $changed ]] || git --no-pager diff "$before" --
  echo "verify: generated files are out of date (run: make generate, then commit):" >&2
  [[ -z $changed ]] || echo "$changed" | sed 's/^/  changed: /' >&2
  [[ -z $new ]] || echo "$new" | sed 's/^/  new:     /' >&2
  failed+=(generate)
fi

if ((${#failed[@]})); then
  echo "verify: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "verify: OK"
