use super::*;

fn scope() -> Scope {
    Scope {
        params: vec!["id".into(), "order".into(), "type".into()],
        has_self: true,
        async_trait: false,
        unnamed: 0,
    }
}

fn lit(text: &str) -> Segment {
    Segment::Literal(text.into())
}

fn ph(root: &str, fields: &[&str]) -> Segment {
    Segment::Placeholder(Placeholder {
        root: root.into(),
        fields: fields.iter().map(|f| (*f).to_owned()).collect(),
    })
}

#[test]
fn splits_templates() {
    assert_eq!(
        parse_template("account:{id}", &scope()),
        Ok(vec![lit("account:"), ph("id", &[])])
    );
    assert_eq!(
        parse_template("account:<id>", &scope()),
        Ok(vec![lit("account:"), ph("id", &[])])
    );
    assert_eq!(
        parse_template("{self.tenant}/{order.lines.0}-x", &scope()),
        Ok(vec![
            ph("self", &["tenant"]),
            lit("/"),
            ph("order", &["lines", "0"]),
            lit("-x")
        ])
    );
    assert_eq!(
        parse_template("{{literal}} a<b <<id> x>y", &scope()),
        Ok(vec![lit("{literal} a<b <id> x>y")])
    );
    assert_eq!(
        parse_template("{r#type}", &scope()),
        Ok(vec![ph("type", &[])])
    );
    // A constant empty key is a mistake (every call would lock one empty key).
    assert!(parse_template("", &scope()).is_err());
}

fn messages(text: &str) -> Vec<String> {
    match parse_template(text, &scope()) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.into_iter().map(|e| e.message).collect(),
    }
}

#[test]
fn reports_every_error() {
    let errors = messages("{} {id:?} {id.len()} {nope} {0} {a-b} }");
    assert_eq!(errors.len(), 7, "{errors:#?}");
    assert!(errors[0].contains("empty placeholder"));
    assert!(errors[1].contains("format spec `:?`"));
    assert!(errors[2].contains("method calls"));
    assert!(errors[3].contains("names no parameter"));
    assert!(errors[3].contains("`id`, `order`"));
    assert!(errors[4].contains("positional"));
    assert!(errors[5].contains("invalid placeholder"));
    assert!(errors[6].contains("unmatched `}`"));
    assert!(messages("account:{id")[0].contains("unclosed `{`"));
    assert!(messages("{ordr}")[0].contains("did you mean `order`?"));
    assert!(messages("<idd>")[0].contains("did you mean `id`?"));
    // Card notation: text that only looks like a placeholder is told about `<<`.
    let errors = messages("html:<body>:{id}");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("`<body>` names no parameter"),
        "{errors:?}"
    );
    assert!(errors[0].contains("write `<<body>`"), "{errors:?}");
    assert!(messages("html:<<body>:{id}").is_empty());
    assert!(!messages("{nope}")[0].contains("<<"));
}

#[test]
fn self_needs_a_receiver() {
    let scope = Scope {
        params: vec!["id".into()],
        has_self: false,
        async_trait: false,
        unnamed: 0,
    };
    let errors = parse_template("{self.id}", &scope)
        .err()
        .unwrap_or_default();
    assert!(errors[0].message.contains("no `self` receiver"));
}

#[test]
fn underscore_parameters_cannot_be_named() {
    // `async fn f(_: u64)`: a parameter that binds no name.
    let unnamed = Scope {
        unnamed: 1,
        ..Scope::default()
    };
    let errors = parse_template("x:{_}", &unnamed).err().unwrap_or_default();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].message.contains("`_` cannot be named"),
        "{errors:?}"
    );
    assert!(errors[0].message.contains("`id: u64`"), "{errors:?}");
    assert!(!errors[0].message.contains("no parameters"), "{errors:?}");
    assert_eq!(errors[0].range, 2..5);
    let errors = parse_template("x:<_>", &unnamed).err().unwrap_or_default();
    assert!(errors[0].message.contains("write `<id>`"), "{errors:?}");
    // Naming something else: the function has parameters, just no named ones.
    let errors = parse_template("x:{id}", &unnamed).err().unwrap_or_default();
    assert!(
        errors[0]
            .message
            .contains("no parameter of this function has a name")
    );
    assert!(
        !errors[0].message.contains("has no parameters"),
        "{errors:?}"
    );
    // Alongside named parameters, those are listed.
    let errors = parse_template("{_}", &scope()).err().unwrap_or_default();
    assert!(
        errors[0]
            .message
            .contains("the parameters are: `self`, `id`")
    );
}
