#!/usr/bin/env bash
# Counts `unsafe` in the crate's Rust sources: blocks (`unsafe {`), functions (`unsafe fn f`,
# `unsafe extern "C" fn f`), impls (`unsafe impl`), extern blocks (`unsafe extern "C" {`), traits,
# and fn-pointer types (`unsafe extern "C" fn(...)`, counted apart: a type is no unsafe code).
# Comments and string/char literals are stripped first, so `// SAFETY:` prose and a message that
# mentions the word do not count; `#[unsafe(no_mangle)]`-style attributes are not counted either.
# Prints one line per file holding any, then the totals, then the `unsafe` blocks and impls with no
# `SAFETY:` comment on their line or in the 8 lines above.
#
#   scripts/unsafe-count.sh [DIR...]     (default: every crate: src crates)
set -euo pipefail
cd "$(dirname "$0")/.."
dirs=("$@")
[ ${#dirs[@]} -gt 0 ] || dirs=(src crates)

find "${dirs[@]}" -name '*.rs' -print0 | sort -z | xargs -0 perl -e '
  my ($tb, $tf, $ti, $te, $tt, $tp, $files) = (0, 0, 0, 0, 0, 0, 0);
  my @bare;
  for my $file (@ARGV) {
    open my $fh, "<", $file or die "$file: $!";
    local $/; my $src = <$fh>; close $fh;
    my @lines = split /\n/, $src, -1;
    # Strip comments and literals in one left-to-right pass so that each hides the others.
    $src =~ s{
        (//[^\n]*)                         # line comment
      | (/\*.*?\*/)                        # block comment (not nested; rare in this tree)
      | (b?r(\#*)".*?"\4)                  # raw string
      | (b?"(?:\\.|[^"\\])*")              # string
      | (b?\x27(?:\\[^\x27]{1,9}|[^\x27\\\n])\x27)  # char literal (not a lifetime)
    }{ my $m = $&; my $nl = ($m =~ tr/\n//); (defined $1 || defined $2 ? " " : "\"\"") . ("\n" x $nl) }gsex;
    my ($b, $f, $i, $e, $t, $p) = (0, 0, 0, 0, 0, 0);
    while ($src =~ /\bunsafe\b\s*(\{|impl\b|trait\b|(?:extern\b\s*(?:""\s*)?)?(\{|fn\b\s*(\()?))/g) {
      my ($what, $tail, $paren) = ($1, $2, $3);
      if ($what eq "{" || $what =~ /^impl/) {
        # A block or impl needs a `SAFETY:` comment on its line or within the 8 lines above.
        my $line = (substr($src, 0, pos($src)) =~ tr/\n//);
        my $from = $line - 8 < 0 ? 0 : $line - 8;
        push @bare, "$file:" . ($line + 1) unless grep { /SAFETY/ } @lines[$from .. $line];
      }
      if ($what eq "{") { $b++ }
      elsif ($what =~ /^impl/) { $i++ }
      elsif ($what =~ /^trait/) { $t++ }
      elsif ($tail eq "{") { $e++ }          # unsafe extern "C" { ... }
      elsif (defined $paren) { $p++ }        # a fn-pointer type: unsafe extern "C" fn(...)
      else { $f++ }                          # unsafe fn name / unsafe extern "C" fn name
    }
    my $n = $b + $f + $i + $e + $t + $p;
    next unless $n;
    $files++;
    printf "%5d  %-40s blocks %d, fns %d, impls %d, extern blocks %d, fn-pointer types %d%s\n",
      $n, $file, $b, $f, $i, $e, $p, $t ? ", traits $t" : "";
    ($tb, $tf, $ti, $te, $tt, $tp) = ($tb + $b, $tf + $f, $ti + $i, $te + $e, $tt + $t, $tp + $p);
  }
  my $all = $tb + $tf + $ti + $te + $tt + $tp;
  printf "total: %d unsafe (blocks %d, fns %d, impls %d, extern blocks %d, fn-pointer types %d, traits %d) in %d files\n",
    $all, $tb, $tf, $ti, $te, $tp, $tt, $files;
  printf "without a SAFETY comment: %d%s\n", scalar @bare, @bare ? " (" . join(", ", @bare) . ")" : "";
' | sort -rn -k1,1 | awk '/^total/ { t = $0; next } /^without/ { w = $0; next } { print } END { print t; print w }'
