"""Length-controlled gaps: stage time against tokens per step, fitted two ways.

- **shared** (the default): ``y = β0 + β1·ktokens + Σ γ_j·[arm = j]``, one slope for all arms. γ_j is
  the gap at equal tokens, the same at every length, with an exact OLS t interval. It is the default
  because one number answers "how much slower at equal length" and the slope uses every step.
- **per-arm**: one line per arm (the published analysis), evaluated at the pooled mean length. It
  is fitted as ``y = β0 + β1·(k − k̄) + Σ γ_j·[arm = j] + Σ δ_j·[arm = j]·(k − k̄)``, whose point
  estimates are the separate lines; γ_j is then the gap at the pooled mean k̄, with its t interval,
  and δ_j how much arm j's slope differs. When δ_j's interval excludes 0 the gap depends on length
  and the shared gap averages over it: the report says so.

Example::

    docs = shared_fits(["G10", "G11"], rows, label_of)      # summary.json regressions
    docs = per_arm_fits(["G10", "G11"], rows, label_of)     # summary.json length_control.per_arm
"""

from __future__ import annotations

from kit.analysis.stats import ols

MODELS = (
    # (response column, token column, token regressor name)
    ("step_time_s", "response_tokens_total", "response_ktokens"),
    ("step_time_s", "total_tokens_total", "total_ktokens"),
    ("rollout_time_s", "response_tokens_total", "response_ktokens"),
    ("actor_train_time_s", "total_tokens_total", "total_ktokens"),
    ("actor_train_time_s", "response_tokens_total", "response_ktokens"),
)
DEFAULT = "shared"
WHY_DEFAULT = ("shared: one slope fitted on every step gives one gap at equal tokens, the same at every length, "
               "with an exact t interval; per-arm lines (the published analysis) give a gap that depends on the "
               "length it is evaluated at (here the pooled mean), reported beside it")


def _ktokens(rows, col):
    return [None if r[col] is None else r[col] * 1e-3 for r in rows]


def _label_coefficients(doc, names, label_of) -> None:
    for coefficient in doc["coefficients"]:
        name = coefficient["name"]
        other = name[4:-1] if name.startswith("arm[") and name.endswith("]") else None
        if other in names[1:]:
            label, controlled = label_of(other)
            coefficient.update(label=label, controlled=controlled)


def shared_fits(names, rows, label_of) -> list[dict]:
    """OLS with a common slope and one indicator per non-reference arm; γ carries its pair's label."""
    out = []
    for response, token_col, token_name in MODELS:
        cols = {"intercept": [1.0] * len(rows), token_name: _ktokens(rows, token_col)}
        for other in names[1:]:
            cols[f"arm[{other}]"] = [1.0 if r["arm"] == other else 0.0 for r in rows]
        fit = ols(response, [r[response] for r in rows], cols)
        if fit is None:
            continue
        doc = fit.to_json()
        doc["model"] = f"{response} ~ 1 + {token_name}" + "".join(f" + arm[{o}]" for o in names[1:])
        doc["reference_arm"] = names[0]
        _label_coefficients(doc, names, label_of)
        out.append(doc)
    return out


def per_arm_fits(names, rows, label_of) -> list[dict]:
    """One line per arm, as one interaction model centred at the pooled mean length (module doc)."""
    out = []
    for response, token_col, token_name in MODELS:
        k = _ktokens(rows, token_col)
        used = [x for x, r in zip(k, rows) if x is not None and r[response] is not None]
        if len(names) < 2 or not used:
            continue
        centre = sum(used) / len(used)
        kc = [None if x is None else x - centre for x in k]
        cols = {"intercept": [1.0] * len(rows), f"{token_name}_centred": kc}
        for other in names[1:]:
            cols[f"arm[{other}]"] = [1.0 if r["arm"] == other else 0.0 for r in rows]
            cols[f"slope_shift[{other}]"] = [None if x is None else (x if r["arm"] == other else 0.0)
                                                          for x, r in zip(kc, rows)]
        fit = ols(response, [r[response] for r in rows], cols)
        if fit is None:
            continue
        doc = fit.to_json()
        doc["model"] = (f"{response} ~ 1 + c + " + " + ".join(f"arm[{o}] + slope_shift[{o}]·c" for o in names[1:])
                        + f", c = {token_name} - {centre:.6g}")
        doc["reference_arm"] = names[0]
        doc["evaluated_at_ktokens"] = centre
        coef = {c["name"]: c for c in doc["coefficients"]}
        slope0 = coef[f"{token_name}_centred"]["estimate"]
        lines = {names[0]: {"slope_s_per_ktoken": slope0, "at_pooled_mean_s": coef["intercept"]["estimate"]}}
        for other in names[1:]:
            lines[other] = {"slope_s_per_ktoken": slope0 + coef[f"slope_shift[{other}]"]["estimate"],
                            "at_pooled_mean_s": coef["intercept"]["estimate"] + coef[f"arm[{other}]"]["estimate"]}
        doc["lines"] = lines
        doc["slopes_differ"] = [o for o in names[1:]
                                if not coef[f"slope_shift[{o}]"]["ci95_low"] <= 0.0 <= coef[f"slope_shift[{o}]"]["ci95_high"]]
        _label_coefficients(doc, names, label_of)
        out.append(doc)
    return out
