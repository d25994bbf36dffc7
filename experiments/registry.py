"""The checkout's studies, in the order the report and the results index show them: the one place a
study is declared (``keyformer.lab.studies`` reads ``STUDIES``). A new study: its folder
``experiments/<study>/`` with a ``findings.py`` (and ``page.md``), a line here, and its ``conf/`` folder
in ``conf/config.yaml``'s search path."""


STUDIES = [
    "experiments.exp1_cnndm.findings",
    "experiments.exp2_dialogsum.findings",
    "experiments.exp3_govreport.findings",
    "experiments.exp4_attention.findings",
    "experiments.exp5_ablations.findings",
    "experiments.exp6_speedup.findings",
    "experiments.exp7_field.findings",
    "experiments.exp8_powered.findings",
    "experiments.exp9_gemma.findings",
    "experiments.exp10_ruler.findings",
    "experiments.crosscheck_kvpress.findings",
    "experiments.gpu_studies.findings",
]
